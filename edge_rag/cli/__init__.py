"""The command line: ``edge-rag`` and its subcommands (``commands``), the options they share (``options``)."""
