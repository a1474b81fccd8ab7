"""The PostgreSQL side of ``pgstore``: table names, the schema, the queries, and the client libraries.

Kept apart from the store class so the SQL reads in one place (and benchmarks can reuse it).
"""
from __future__ import annotations

from .errors import StoreError
from .lexical import POSTINGS_BUDGET, candidate_terms, tsquery

META, DOCUMENTS, PASSAGES = "edge_rag_meta", "edge_rag_documents", "edge_rag_passages"
WRITER_LOCK = 0x65646765_72616700  # pg_advisory_xact_lock key of edge-rag writers ("edgerag" in ASCII)
POOL_MIN, POOL_MAX = 1, 4
CONNECT_TIMEOUT_S = 10
COUNT_TTL_S = 30.0  # how stale the count that scales hnsw.ef_search may be (it grows by log2 of the count)

SCHEMA = f"""
CREATE TABLE {META} (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE {DOCUMENTS} (
    doc_id text PRIMARY KEY, title text NOT NULL, source text, sha text, complete boolean NOT NULL DEFAULT true);
CREATE TABLE {PASSAGES} (
    id bigint PRIMARY KEY, doc_id text NOT NULL REFERENCES {DOCUMENTS}(doc_id) ON DELETE CASCADE,
    title text NOT NULL, text text NOT NULL, position integer NOT NULL, embedding vector({{dim}}) NOT NULL);
CREATE INDEX {PASSAGES}_doc ON {PASSAGES}(doc_id);
CREATE INDEX {PASSAGES}_hnsw ON {PASSAGES} USING hnsw (embedding vector_cosine_ops)
    WITH (m = {{m}}, ef_construction = {{ef_construction}});
"""
# The full-text index: a tsvector of title and text computed by PostgreSQL on every insert (so it commits with the
# passage), behind a GIN index. Stores made before it get both on open (one transaction, under the writers' lock).
FULL_TEXT = f"""
ALTER TABLE {PASSAGES} ADD COLUMN tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('english', title || ' ' || text)) STORED;
CREATE INDEX {PASSAGES}_tsv ON {PASSAGES} USING gin (tsv);
"""
# Ranked by every term of the question (q), among the passages holding its rarest terms (c: lexical.py's budget).
SEARCH_TEXT = f"""SELECT id, ts_rank_cd(tsv, q) AS rank FROM {PASSAGES}, to_tsquery('english', %s) q,
    to_tsquery('english', %s) c WHERE tsv @@ c ORDER BY rank DESC, id LIMIT %s"""
POSTINGS = f"""SELECT (SELECT count(*) FROM {PASSAGES} WHERE tsv @@ to_tsquery('english', t))
FROM unnest(%s::text[]) WITH ORDINALITY AS terms(t, i) ORDER BY i"""
SEARCH = f"""SELECT id, doc_id, title, text, position, embedding <=> %b AS distance
FROM {PASSAGES} ORDER BY distance LIMIT %s"""
SCORED = f"SELECT id, doc_id, title, text, position, embedding <=> %b FROM {PASSAGES} WHERE id = ANY(%s)"
DOCUMENT = f"""SELECT sha, coalesce(source, ''), complete,
    (SELECT count(*) FROM {PASSAGES} p WHERE p.doc_id = d.doc_id) FROM {DOCUMENTS} d WHERE doc_id = %s"""


def client():
    """psycopg, its pool and the pgvector adapter, or a StoreError saying how to install them."""
    try:
        import psycopg
        import psycopg_pool
        from pgvector.psycopg import register_vector
    except ImportError as exc:
        raise StoreError(f"a postgresql:// store needs the PostgreSQL client ({exc.name} is missing): "
                         "pip install 'edge-rag[pg]'") from None
    return psycopg, psycopg_pool, register_vector


def postings(conn, terms: list[str]) -> list[int]:
    """How many passages hold each term, in one round trip."""
    return [n for (n,) in conn.execute(POSTINGS, ([tsquery([t]) for t in terms],))]


def text_search_params(terms: list[str], counts: list[int], k: int, budget: int = POSTINGS_BUDGET
                       ) -> tuple[str, str, int]:
    """SEARCH_TEXT's parameters: the query of all ``terms``, that of the rarest (lexical.candidate_terms over
    their postings ``counts``) and k."""
    return tsquery(terms), tsquery(candidate_terms(terms, counts, budget)[0]), k


def has_full_text(conn) -> bool:
    return conn.execute("SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = 'tsv'",
                        (PASSAGES,)).fetchone() is not None


def delete_documents(conn, doc_ids: list[str]) -> int:
    """Delete documents (their passages cascade); the number of passages deleted."""
    if not doc_ids:
        return 0
    n = conn.execute(f"SELECT count(*) FROM {PASSAGES} WHERE doc_id = ANY(%s)", (doc_ids,)).fetchone()[0]
    conn.execute(f"DELETE FROM {DOCUMENTS} WHERE doc_id = ANY(%s)", (doc_ids,))
    return int(n)
