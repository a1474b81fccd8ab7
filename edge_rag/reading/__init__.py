"""Reading the passages for an answer: the neural reader, the rule extractor (``extract``), llama.cpp generation."""
