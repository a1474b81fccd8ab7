"""Passage stores (embedded: SQLite + hnswlib; PostgreSQL + pgvector), their files and locks, the answer cache."""
