"""Documents in, passages out: file formats (PDF/HTML in a limited child process), text helpers, chunking, indexing."""
