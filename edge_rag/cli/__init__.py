"""The command line: ``edge-rag`` and its subcommands (``commands``), the options they share (``options``), how
``ask`` reads questions and prints answers (``answers``)."""
