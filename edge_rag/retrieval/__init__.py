"""From a question to a context: the encoder, hybrid dense + full-text search, rerank, the tier router, compression."""
