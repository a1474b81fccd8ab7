"""The PostgreSQL side of ``pgstore``: table names, the schema, the queries, and the client libraries.

Kept apart from the store class so the SQL reads in one place (and benchmarks can reuse it).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from ..errors import StoreBusy, StoreError, StoreUnavailable
from ..retrieval.lexical import POSTINGS_BUDGET, candidate_terms, tsquery
from .dburl import scrub
from .pgbreaker import invalid_option, lost, refused_login
from .store_db import CONTEXT_NEIGHBOURS, CONTEXT_WEIGHT, Part, commit_contexts

META, DOCUMENTS, PASSAGES = "edge_rag_meta", "edge_rag_documents", "edge_rag_passages"
WRITER_LOCK = 0x65646765_72616700  # pg_advisory_xact_lock key of edge-rag writers ("edgerag" in ASCII)
POOL_MIN, POOL_MAX = 1, 4
# The server down, a call fails as one connection attempt would (not after the pool's default 30 s), and the pool
# retries a lost connection as long, then the next call connects afresh: its retries backing off 1, 2, 4… s apart for
# 5 min failed questions for up to as long again after the server was back (10 s after a 20 s outage).
CONNECT_TIMEOUT_S = 10
# A device that lost power mid-run held the writers' session lock until the server's TCP gave up on it: 2 h 11 min at
# Linux's default keepalive (7,200 s idle, then 9 probes 75 s apart), every other device's indexing refused meanwhile.
# Each session asks the server to probe an idle device after 15 s, every 5 s, 3 times (a dead one is dropped and its
# locks freed within ~30 s), and libpq probes the server alike (a device waiting on a dead server gives up as soon).
# CLIENT holds defaults (a URL's own win: dburl.conninfo); a write the server stops taking (a cable pulled mid-COPY) is
# no idle connection and waited for TCP's retransmissions (~15 min): tcp_user_timeout ends it as the probes would. The
# server's probes stay ours (configure), whatever the URL's ``options``: they free the writers' lock for every device.
KEEPALIVE = {"idle": 15, "interval": 5, "count": 3}
CLIENT = {"connect_timeout": CONNECT_TIMEOUT_S, "keepalives": 1, **{f"keepalives_{k}": v for k, v in KEEPALIVE.items()},
          "tcp_user_timeout": 1000 * (KEEPALIVE["idle"] + KEEPALIVE["interval"] * KEEPALIVE["count"])}
# How long a read waits for another session's lock on the store's tables (VACUUM FULL, LOCK TABLE, an upgrade): a
# kiosk's question waited as long as the lock was held (40 s of a 40 s LOCK TABLE; a VACUUM FULL of a big store takes
# minutes), health checks with it. Set on each pooled connection unless its URL, role or database sets lock_timeout;
# writers wait as before (PgStore._lock). HINTS: what a StoreError adds to the server's message, by its SQLSTATE.
LOCK_WAIT_S = 10.0
# A read whose server stops answering is cut after this long (pgbreaker.Breaker.connection): past the lock wait, so a
# read held by a lock fails naming it, and with 5 s to spare for the read itself (milliseconds on a kiosk's store).
READ_WAIT_S = LOCK_WAIT_S + 5.0
LOCK_WAIT = ", set_config('lock_timeout', CASE current_setting('lock_timeout') WHEN '0' THEN %s ELSE " \
    "current_setting('lock_timeout') END, false)"
HINTS = {"42501": "; the role needs SELECT (devices) or INSERT/UPDATE (indexers) on the edge_rag_* tables, and an "
                  "administrator must run CREATE EXTENSION vector once",
         "55P03": "; another session holds a lock on the store's tables (VACUUM FULL, LOCK TABLE, an upgrade): "
                  "ask again when it has finished",
         "57014": "; the database did not answer in time (busy, or another session holds a lock on the store's "
                  "tables): retry",
         "28000": "; the server refused this login: check the URL's user, password (or ~/.pgpass) and database"}
# The SQLSTATEs (prefixes) of a database that cannot be reached now or of a wait that ran out, where the same call
# succeeds once it is back: none (no server answered: a connection attempt, the pool's wait), connections (08), shut
# down, crashed or starting (57P01-03), too many connections, the statement and lock timeouts. psycopg's other
# OperationalErrors are faults: a table's data file missing ("could not open file"), an I/O error, the disk full.
UNAVAILABLE = ("08", "57P01", "57P02", "57P03", "53300", "57014", "55P03")
NO_CONNECTION = "; the database cannot be reached now (down, restarting, refusing connections or not answering): retry"
# A health poll (PgStore.check) waits this long for a connection, then for its read: a database refusing connections
# held it CONNECT_TIMEOUT_S (10 s), a lock on the meta table LOCK_WAIT_S, where a watchdog or load balancer polls
# every few seconds and wants to hear at once that the store cannot be read. Both at most: ``within``'s bound.
CHECK_WAIT_S = 2.0
T = TypeVar("T")
COUNT_TTL_S = 30.0  # how stale the count that scales hnsw.ef_search may be (it grows by log2 of the count)

# Vectors stay in the row (compressed first, out of line only as a last resort): PostgreSQL's default moves a row's
# largest values out of line once it passes ~2 kB (the passage's text, context and tsvector do), and its planner
# prices a sequential scan by the table's own pages, not the TOAST table it reads each vector from. Out of line, the
# vectors made every search a full scan (11,500 passages: a Seq Scan, not the HNSW index).
INLINE_VECTORS = f"ALTER TABLE {PASSAGES} ALTER COLUMN embedding SET STORAGE MAIN"
SCHEMA = f"""
CREATE TABLE {META} (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE {DOCUMENTS} (
    doc_id text PRIMARY KEY, title text NOT NULL, source text, sha text, complete boolean NOT NULL DEFAULT true);
CREATE TABLE {PASSAGES} (
    id bigint PRIMARY KEY, doc_id text NOT NULL REFERENCES {DOCUMENTS}(doc_id) ON DELETE CASCADE,
    title text NOT NULL, text text NOT NULL, position integer NOT NULL, embedding vector({{dim}}) NOT NULL);
{INLINE_VECTORS};
CREATE INDEX {PASSAGES}_doc ON {PASSAGES}(doc_id);
CREATE INDEX {PASSAGES}_hnsw ON {PASSAGES} USING hnsw (embedding vector_cosine_ops)
    WITH (m = {{m}}, ef_construction = {{ef_construction}});
"""
# A passage's context (store_db.CONTEXT_NEIGHBOURS): the text of its document's passages within that many positions,
# for every stored passage at once (the upgrade of a store from before it).
SET_CONTEXT = f"""UPDATE {PASSAGES} p SET context = (SELECT string_agg(n.text, ' ' ORDER BY n.position)
    FROM {PASSAGES} n WHERE n.doc_id = p.doc_id AND n.id <> p.id
    AND n.position BETWEEN p.position - {CONTEXT_NEIGHBOURS} AND p.position + {CONTEXT_NEIGHBOURS})"""
# The full-text index: a tsvector of title and text (weight A) and context (B) computed by PostgreSQL on every insert
# or context update (so it commits with the passage), behind a GIN index. Stores made before it, or before its
# context, get both on open (one transaction, under the writers' lock).
FULL_TEXT = f"""
ALTER TABLE {PASSAGES} DROP COLUMN IF EXISTS tsv;
ALTER TABLE {PASSAGES} ADD COLUMN IF NOT EXISTS context text;
{SET_CONTEXT};
ALTER TABLE {PASSAGES} ADD COLUMN tsv tsvector GENERATED ALWAYS AS (
    setweight(to_tsvector('english', title || ' ' || text), 'A')
    || setweight(to_tsvector('english', coalesce(context, '')), 'B')) STORED;
CREATE INDEX {PASSAGES}_tsv ON {PASSAGES} USING gin (tsv);
"""
# Whether the passages table exists, read as of this statement: inside the writers' lock, ``to_regclass`` answered from
# the session's catalog cache, which an advisory lock does not refresh, and missed a table another device had just made.
HAS_STORE = f"""SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relname = '{PASSAGES}' AND n.nspname = current_schema())"""
# Ranked by every term of the question (q), among the passages holding its rarest terms (c: lexical.py's budget);
# the weights of labels D, C, B (context) and A (title and text).
SEARCH_TEXT = f"""SELECT id, ts_rank_cd('{{0, 0, {CONTEXT_WEIGHT}, 1}}', tsv, q) AS rank FROM {PASSAGES},
    to_tsquery('english', %s) q, to_tsquery('english', %s) c WHERE tsv @@ c ORDER BY rank DESC, id LIMIT %s"""
POSTINGS = f"""SELECT (SELECT count(*) FROM {PASSAGES} WHERE tsv @@ to_tsquery('english', t))
FROM unnest(%s::text[]) WITH ORDINALITY AS terms(t, i) ORDER BY i"""
SEARCH = f"""SELECT id, doc_id, title, text, position, embedding <=> %(q)b AS distance
FROM {PASSAGES} ORDER BY distance LIMIT %(k)s"""
# When some passages are not reached by the graph (``exact``, reachability.py): the HNSW top k and those searched exactly
# (by primary key: a set-returning function here made the planner scan the table), the best k of both.
SEARCH_WITH_EXACT = f"""SELECT * FROM (({SEARCH})
    UNION SELECT id, doc_id, title, text, position, embedding <=> %(q)b FROM {PASSAGES} WHERE id = ANY(%(exact)s)
) found ORDER BY distance LIMIT %(k)s"""
# Of the passages ``ids`` (None: all), those whose own embedding's top k through the HNSW index misses them.
UNREACHABLE = f"""SELECT p.id FROM {PASSAGES} p WHERE (%(ids)s::bigint[] IS NULL OR p.id = ANY(%(ids)s))
    AND p.id NOT IN (SELECT q.id FROM {PASSAGES} q ORDER BY q.embedding <=> p.embedding LIMIT %(k)s)"""
# doctor.check_recall's exact side: each query vector's top k among the passages with ids in [lo, hi), by the same
# distance as SEARCH but never through the HNSW index (a scan of a materialized CTE). The embeddings are read once into
# the CTE, de-TOASTed by the cast (a vector(384) is stored out of line: one scan of the table per query read each again,
# ~12x the distances' cost), and scanned once per query; EXACT_SPAN ids at a time keep the CTE near work_mem.
EXACT = f"""WITH p AS MATERIALIZED (SELECT id, embedding::real[]::vector AS e FROM {PASSAGES}
    WHERE id >= %(lo)s AND id < %(hi)s)
SELECT q.i, t.id, t.d FROM unnest(%(q)s::vector[]) WITH ORDINALITY AS q(v, i)
CROSS JOIN LATERAL (SELECT id, e <=> q.v AS d FROM p ORDER BY d LIMIT %(k)s) t"""
EXACT_SPAN = 2048
SCORED = f"SELECT id, doc_id, title, text, position, embedding <=> %b FROM {PASSAGES} WHERE id = ANY(%s)"
PASSAGES_BY_ID = f"SELECT id, doc_id, title, text, position FROM {PASSAGES} WHERE id = ANY(%s)"
# Documents in the order their first passage was stored (passage ids are never reused), as the embedded store's rowid.
TITLES = f"""SELECT d.title FROM {DOCUMENTS} d WHERE d.title <> ''
    ORDER BY (SELECT min(p.id) FROM {PASSAGES} p WHERE p.doc_id = d.doc_id) NULLS LAST, d.doc_id LIMIT %s"""
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


def store_error(psycopg, exc, what: str, url: str) -> StoreError:
    """The psycopg error ``exc`` as a StoreError saying ``what`` failed (naming the store by its masked URL): the
    server's message, detail and hint without the SQL it quoted, the password of ``url`` never shown, a hint by its
    SQLSTATE (HINTS); a StoreUnavailable when the database could not be reached or a lock wait ran out (UNAVAILABLE:
    connections, the pool, lock and statement timeouts, a server shutting down), which the server answers with 503
    (retry), not 500: a kiosk or load balancer tells them apart."""
    diag = exc.diag  # the server's message, not the statement it quotes ("LINE 2: FROM edge_rag_passages ORDER BY…")
    message = " ".join(filter(None, (diag.message_primary, diag.message_detail, diag.message_hint))) or str(exc)
    message = scrub(" ".join(message.split()), url)
    if isinstance(exc, psycopg.errors.UniqueViolation):
        message = f"a document is already in the store ({message})"
    state = exc.sqlstate or ("28000" if refused_login(exc) else "22023" if invalid_option(exc) else "08")  # none: libpq
    kind = StoreUnavailable if isinstance(exc, psycopg.OperationalError) and state.startswith(UNAVAILABLE) else StoreError
    return kind(f"{what}: {message}{HINTS.get(state, NO_CONNECTION if lost(psycopg, exc) else '')}")


def checked_meta(connection: Callable[[float], Any]) -> dict[str, str]:
    """The meta table as a health poll reads it: CHECK_WAIT_S for a ``connection``, as long for the read, under a
    question's lock on every table (a LOCK TABLE on the passages held each question 10 s before its 503, health ok)."""
    with connection(CHECK_WAIT_S) as conn, conn.transaction():
        conn.execute(f"SET LOCAL statement_timeout = {CHECK_WAIT_S * 1000:.0f}")
        conn.execute(f"LOCK TABLE {META}, {DOCUMENTS}, {PASSAGES} IN ACCESS SHARE MODE")
        return dict(conn.execute(f"SELECT key, value FROM {META}").fetchall())


def within(checks: ThreadPoolExecutor, read: Callable[[], T], what: str) -> T:
    """``read()`` on the one thread of ``checks``, or a StoreUnavailable once its own bounds have passed (twice
    CHECK_WAIT_S): a server that stopped answering on an open connection (hung, its processes stopped, its VM paused)
    held a health poll for good (no answer in 60 s, then as long again for the next), as no timeout of the server's,
    the pool's or TCP's ends a wait on a peer that acknowledges. That thread is left waiting; a check behind it waits
    its bound, then is dropped."""
    future = checks.submit(read)
    try:
        return future.result(timeout=2 * CHECK_WAIT_S)
    except FutureTimeout:
        future.cancel()
        raise StoreUnavailable(f"{what}: the database did not answer within {2 * CHECK_WAIT_S:g} s{NO_CONNECTION}") \
            from None


def configure(conn, register, ef_search: int) -> None:
    """Each pooled connection: the pgvector adapter (``register``), the HNSW search breadth (``PgStore.search`` widens
    it with the store), the server's keepalive probes (KEEPALIVE; ignored on a Unix socket), a bound on waiting for
    another session's lock (LOCK_WAIT_S), in one round trip, and, on pgvector ≥ 0.8, iterative scans: a scan that
    ends with fewer than k live rows (deleted passages in the graph) goes on searching instead of returning short."""
    register(conn)
    settings = {"hnsw.ef_search": ef_search, **{f"tcp_keepalives_{k}": v for k, v in KEEPALIVE.items()}}
    conn.execute("SELECT " + ", ".join(["set_config(%s, %s, false)"] * len(settings)) + LOCK_WAIT,
                 [x for name, value in settings.items() for x in (name, str(value))] + [f"{LOCK_WAIT_S * 1000:.0f}ms"])
    version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    if version and tuple(int(x) for x in version[0].split(".")[:2] if x.isdigit()) >= (0, 8):
        conn.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', false)")


def acquire(conn, timeout: float, location: str) -> None:
    """Take the writers' session lock on ``conn``, waiting up to ``timeout`` seconds for another device's writer."""
    deadline = time.monotonic() + timeout
    while not conn.execute("SELECT pg_try_advisory_lock(%s)", (WRITER_LOCK,)).fetchone()[0]:
        if time.monotonic() >= deadline:
            raise StoreBusy(f"store {location} is being written by another process; waited "
                            f"{timeout:g} s — retry when it is done, or wait longer")
        time.sleep(0.05)


def postings(conn, terms: list[str]) -> list[int]:
    """How many passages hold each term, in one round trip."""
    return [n for (n,) in conn.execute(POSTINGS, ([tsquery([t]) for t in terms],))]


def text_search_params(terms: list[str], counts: list[int], k: int, budget: int = POSTINGS_BUDGET
                       ) -> tuple[str, str, int]:
    """SEARCH_TEXT's parameters: the query of all ``terms``, that of the rarest (lexical.candidate_terms over
    their postings ``counts``) and k."""
    return tsquery(terms), tsquery(candidate_terms(terms, counts, budget)[0]), k


def part_contexts(conn, parts: Sequence[Part], first: int) -> tuple[dict[int, str], list[tuple[str, int]]]:
    """store_db.commit_contexts for the passages ``parts`` add (ids from ``first`` on): computed before the COPY and
    written with each row (an UPDATE re-inserts a row into every index, HNSW too)."""
    groups, pid = [], first
    for p in parts:
        groups.append((p.doc.doc_id, [(pid + k, p.start + k, text) for k, text in enumerate(p.texts)]))
        pid += len(p.texts)
    return commit_contexts([g for g in groups if g[1]], lambda doc_id, lo, hi: conn.execute(
        f"SELECT id, position, text FROM {PASSAGES} WHERE doc_id = %s AND position BETWEEN %s AND %s "
        "ORDER BY position", (doc_id, lo, hi)).fetchall())


def has_full_text(conn) -> bool:
    """Whether the passages have the full-text column and the context it reads."""
    return conn.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = %s "
                        "AND column_name IN ('tsv', 'context')", (PASSAGES,)).fetchone()[0] == 2


def vectors_inline(conn) -> bool:
    """Whether new rows keep their vector in the row (INLINE_VECTORS)."""
    return conn.execute("SELECT attstorage = 'm' FROM pg_attribute WHERE attrelid = %s::regclass "
                        "AND attname = 'embedding'", (PASSAGES,)).fetchone()[0]


def upgrade(conn) -> bool:
    """Bring a store an older edge-rag made up to date, each step in one transaction under the writers' lock: the
    full-text column (FULL_TEXT) and vectors kept in the row (INLINE_VECTORS; the rows already written stay out of line
    until the table is rewritten: ``VACUUM FULL``, which ``edge-rag doctor`` asks for). Only a role that owns the
    table tries (a kiosk's read-only role never waits for the writers' lock to open a store); False if the store
    then lacks the full-text column (dense search only, until its owner opens it)."""
    owner = conn.execute("SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = %s::regclass",
                         (PASSAGES,)).fetchone()[0]
    for done, step in ((has_full_text, FULL_TEXT), (vectors_inline, INLINE_VECTORS)):
        if owner and not done(conn):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITER_LOCK,))
                if not done(conn):
                    conn.execute(step)
    return has_full_text(conn)


def check_locale(conn, location: str) -> None:
    """Warn when the database's LC_CTYPE is C or POSIX: PostgreSQL's text search then lower-cases A-Z alone and reads
    every other character as a letter, so "Москва", "Émile" or "İstanbul" are never found by the word a visitor types,
    nor "museum" in "museum’s" or "“Harbour”" (0 of 5 such passages found where C.UTF-8 finds 5)."""
    ctype = conn.execute("SELECT datctype FROM pg_database WHERE datname = current_database()").fetchone()[0]
    if ctype in ("C", "POSIX"):
        logging.getLogger("edge_rag").warning(
            "%s: the database's LC_CTYPE is %s, so full-text search finds no word written with capitals outside A-Z "
            "or beside typographic quotes; make the database with a UTF-8 locale (LC_CTYPE C.UTF-8, en_US.UTF-8)",
            location, ctype)


def vectors_out_of_line(conn, passages: int, dim: int) -> bool:
    """Whether most of the ``passages`` stored vectors sit outside their rows (a store written before INLINE_VECTORS):
    the table's own pages hold less than its vectors would fill, and PostgreSQL's planner, pricing a scan by those
    pages, then scans the whole table for every search instead of using the HNSW index."""
    size = conn.execute(f"SELECT pg_relation_size('{PASSAGES}')").fetchone()[0]
    return size < passages * (4 * dim + 8)


def set_meta(conn, **values: object) -> None:
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {META} VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                        [(k, str(v)) for k, v in values.items()])


def delete_documents(conn, doc_ids: list[str]) -> int:
    """Delete documents (their passages cascade); the number of passages deleted."""
    if not doc_ids:
        return 0
    n = conn.execute(f"SELECT count(*) FROM {PASSAGES} WHERE doc_id = ANY(%s)", (doc_ids,)).fetchone()[0]
    conn.execute(f"DELETE FROM {DOCUMENTS} WHERE doc_id = ANY(%s)", (doc_ids,))
    return int(n)
