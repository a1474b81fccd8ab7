"""Passage store on PostgreSQL + pgvector: one corpus per database, shared by a fleet of devices.

Same contract as the embedded store (``stores.PassageStore``): passages with their vectors in one table behind an HNSW
index (cosine ops), documents with their content hash and whether all their passages are in, a meta table with the
dimension, the encoder's hash, the count and a version; a store refuses vectors from another encoder; ``add`` (parts of
documents, and the documents they replace) is one transaction (a crash or an error mid-batch leaves the last committed
state: PostgreSQL rolls the transaction back when the client dies) under a transaction-scoped advisory lock, so writers
on any number of devices take turns; passage ids are never reused. ``writing()`` holds the same lock for a whole
indexing run; at its end the passages the HNSW graph does not reach are recorded and searched exactly beside it
(reachability.py). Connections come from a small psycopg pool; every message names the database by its URL, password masked.

Needs the ``pg`` extra (psycopg 3, psycopg-pool, pgvector) and ``CREATE EXTENSION vector`` in the database (done here
when the role may; otherwise an administrator runs it once).
"""
from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from functools import partial

import numpy as np

from ..errors import StoreError, check_seconds
from ..retrieval.lexical import POSTINGS_BUDGET, Postings, rarest
from ..types import Passage, in_order
from . import hnsw, reachability
from . import pgsql as Q
from .dburl import check_url, conninfo, mask_url
from .passage_kinds import KINDS_KEY, kinds_after, read_kinds
from .pgbreaker import pg_breaker
from .store_db import STORE_ID, DocumentState, Part, new_identity
from .store_meta import Committed, check_meta
from .writer_lock import held


class PgStore:
    """Open (or, if ``create``, create) the store in the database ``url`` for ``dim``-d vectors from
    ``encoder_id``. ``lock_timeout`` is how long a writer waits for another device's write to finish."""

    commit_growth = 0.0  # PostgreSQL grows its HNSW index in place: commits stay one batch each
    graph_misses = reachability.misses_pg  # PassageStore

    def __init__(self, url: str, dim: int, encoder_id: str = "", m: int = 16, ef_construction: int = 200,
                 ef_search: int = 64, pool_size: int = Q.POOL_MAX, create: bool = True,
                 lock_timeout: float = 0.0, passage_kind: str = "") -> None:
        self.lock_timeout, self.passage_kind = check_seconds(lock_timeout, "lock_timeout"), passage_kind
        self._psycopg, pool_mod, self._register = Q.client()
        self._url, self.location, self.dim, self.ef_search = check_url(url), mask_url(url), dim, ef_search
        self._write_lock = threading.RLock()
        self._writer = None  # the connection holding the writers' session lock during ``writing()``
        self._writer_thread: int | None = None
        self.full_text = True  # False: the store predates the full-text column and this role may not add it
        self._count, self._counted_at = 0, -Q.COUNT_TTL_S  # the size ef_search is scaled to (re-read every TTL)
        self._unreachable: list[int] = []  # passages searched exactly beside the graph (reachability.py), re-read likewise
        self._postings = Postings()  # of the terms searched, re-counted every COUNT_TTL_S
        self._session_ef: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # pooled connection → its ef
        self._checks = ThreadPoolExecutor(1, thread_name_prefix="edge-rag-check")  # check()'s reads: pgsql.within
        with self._errors("cannot open"):
            info = conninfo(url, Q.CLIENT)  # the URL's own settings win over ours
            self._breaker = pg_breaker(self._psycopg, info)  # the database down: calls fail at once until it answers
            with self._psycopg.connect(info, autocommit=True) as conn:
                meta = self._setup(conn, dim, encoder_id, m, ef_construction, create)
            check_meta(meta, dim, encoder_id, self.location, "database")
            self.encoder_id = encoder_id or meta.get("encoder", "")
            self.pool = pool_mod.ConnectionPool(
                info, min_size=Q.POOL_MIN, max_size=max(pool_size, Q.POOL_MIN), open=True,
                configure=partial(Q.configure, register=self._register, ef_search=ef_search),
                check=self._breaker.checked(pool_mod.ConnectionPool.check_connection),  # a dropped one is replaced
                timeout=Q.CONNECT_TIMEOUT_S, reconnect_timeout=Q.CONNECT_TIMEOUT_S,  # the server down: pgsql.py
                kwargs={"autocommit": True}, name="edge-rag")

    # -- reading -------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return int(self._meta().get("count", 0))

    @property
    def version(self) -> int:
        """Bumped by every add on any device; caches keyed on it go stale when documents change."""
        return int(self._meta().get("version", 0))

    @property
    def stamp(self) -> tuple[str, int]:  # PassageStore: one read, so both are of one store
        return (meta := self._meta()).get(STORE_ID, ""), int(meta.get("version", 0))

    @property
    def passage_kinds(self) -> frozenset[str]:  # PassageStore
        return read_kinds(self._meta().get(KINDS_KEY))

    def check(self) -> Committed:  # PassageStore: a store made again is followed (stamp); bounded: pgsql.within
        """Through the breaker as a question (a login refused once the store is open said 'retry' for good)."""
        connection = partial(self._breaker.connection, self.pool, None)
        with self._errors("cannot read"):
            meta = Q.within(self._checks, partial(Q.checked_meta, connection), f"cannot read store {self.location}")
        return Committed.of(meta, int(meta.get("count", 0)))

    def has_document(self, doc_id: str) -> bool:
        return (state := self.document(doc_id)) is not None and state.complete

    def document(self, doc_id: str) -> DocumentState | None:
        if "\x00" in doc_id:  # PostgreSQL text cannot hold one (indexing.check_document refuses it): none stored
            return None
        with self._errors("cannot read"), self._connection() as conn:
            row = conn.execute(Q.DOCUMENT, (doc_id,)).fetchone()
        return None if row is None else DocumentState(row[0], row[1], bool(row[2]), int(row[3]))

    def documents_from(self, source: str) -> list[str]:  # PassageStore
        with self._errors("cannot read"), self._connection() as conn:
            return [r[0] for r in conn.execute(f"SELECT doc_id FROM {Q.DOCUMENTS} WHERE source = %s", (source,))]

    def titles(self, limit: int) -> list[str]:  # PassageStore
        with self._errors("cannot read"), self._connection() as conn:
            return [r[0] for r in conn.execute(Q.TITLES, (limit,))]

    def search(self, vector: np.ndarray, k: int) -> list[Passage]:
        """Top-k passages by cosine similarity (HNSW, ``hnsw.ef_search`` scaled to the store's size and k
        as for the embedded store: ``hnsw.ef_for``), best first, with ``score`` set. One round trip: the
        breadth is set on a pooled connection only when it changes, from a count re-read every Q.COUNT_TTL_S."""
        if k <= 0:
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if time.monotonic() - self._counted_at > Q.COUNT_TTL_S:
            meta, self._counted_at = self._meta(), time.monotonic()
            self._count, self._unreachable = int(meta.get("count", 0)), reachability.recorded(meta)
        ef = hnsw.ef_for(self._count, k, self.ef_search)
        with self._errors("cannot search"), self._connection() as conn:
            if self._session_ef.get(conn) != ef:
                conn.execute("SELECT set_config('hnsw.ef_search', %s, false)", (str(ef),))
                self._session_ef[conn] = ef
            sql = Q.SEARCH_WITH_EXACT if self._unreachable else Q.SEARCH
            rows = conn.execute(sql, {"q": query, "k": k, "exact": self._unreachable}).fetchall()
        return [Passage(i, d, t, x, p, score=1.0 - float(dist)) for i, d, t, x, p, dist in rows]

    def search_text(self, terms: Sequence[str], k: int, budget: int = POSTINGS_BUDGET) -> list[tuple[int, float]]:
        """Top-k passage ids by full-text rank (``ts_rank_cd`` of the MAX_TERMS rarest ``terms``) over title, text and
        context, among the passages holding the rarest terms (``budget`` postings, lexical.py), best first."""
        if not terms or k <= 0 or not self.full_text:
            return []
        terms = list(terms)
        with self._errors("cannot search"), self._connection() as conn:
            counts = self._postings.of(terms, time.monotonic() // Q.COUNT_TTL_S, lambda new: Q.postings(conn, new))
            terms, counts = rarest(terms, counts)
            params = Q.text_search_params(terms, counts, k, budget)
            rows = conn.execute(Q.SEARCH_TEXT, params).fetchall() if terms else []
        return [(int(i), float(r)) for i, r in rows]

    def scored(self, vector: np.ndarray, ids: Sequence[int]) -> list[Passage]:
        """Passages by id, in the order given, with the exact cosine of their vectors as ``score``: one round trip."""
        if not ids:
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        with self._errors("cannot search"), self._connection() as conn:
            rows = conn.execute(Q.SCORED, (query, [int(i) for i in ids])).fetchall()
        return in_order((Passage(i, d, t, x, p, score=1.0 - float(dist)) for i, d, t, x, p, dist in rows), ids)

    def passages(self, ids: Sequence[int]) -> list[Passage]:
        """Passages by id, in the order given."""
        if not ids:
            return []
        with self._errors("cannot read"), self._connection() as conn:
            rows = conn.execute(Q.PASSAGES_BY_ID, ([int(i) for i in ids],)).fetchall()
        return in_order((Passage(*r) for r in rows), ids)

    # -- writing -------------------------------------------------------------------------------
    def add(self, parts: Sequence[Part], vectors: np.ndarray, remove: Sequence[str] = ()) -> int:
        """Commit ``parts`` (one vector per passage text, in order) and remove the documents ``remove``
        in one transaction under the writers' lock. Returns the number of passages added."""
        n = sum(len(p.texts) for p in parts)
        if n != len(vectors):
            raise ValueError(f"{n} passages but {len(vectors)} vectors")
        if not parts and not remove:
            return 0
        vectors = np.asarray(vectors, dtype=np.float32)
        if n and vectors.shape[1] != self.dim:
            raise ValueError(f"{vectors.shape[1]}-d vectors for a {self.dim}-d store")
        with self._errors("cannot add to"), self._connection(write=True) as conn, conn.transaction():
            meta = self._lock(conn)
            gone = Q.delete_documents(conn, list(remove))
            first = int(meta.get("next_id") or  # ids are never reused, even after a remove
                        conn.execute(f"SELECT coalesce(max(id), -1) + 1 FROM {Q.PASSAGES}").fetchone()[0])
            contexts, updates = Q.part_contexts(conn, parts, first)
            done = [p.doc.doc_id for p in parts if p.start > 0 and p.last]  # documents finished in this batch
            if done:
                conn.execute(f"UPDATE {Q.DOCUMENTS} SET complete = true WHERE doc_id = ANY(%s)", (done,))
            with conn.cursor() as cur:
                with cur.copy(f"COPY {Q.DOCUMENTS} (doc_id, title, source, sha, complete) FROM STDIN") as copy:
                    for p in parts:
                        if p.start == 0:
                            copy.write_row((p.doc.doc_id, p.doc.title, p.doc.source, p.sha, p.last))
                cols = "id, doc_id, title, text, position, context, embedding"
                with cur.copy(f"COPY {Q.PASSAGES} ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types(["int8", "text", "text", "text", "int4", "text", "vector"])
                    rows = ((p.doc.doc_id, p.doc.title, text, pos)
                            for p in parts for pos, text in enumerate(p.texts, p.start))
                    for at, (doc_id, title, text, pos) in enumerate(rows):
                        copy.write_row((first + at, doc_id, title, text, pos, contexts[first + at], vectors[at]))
            conn.cursor().executemany(f"UPDATE {Q.PASSAGES} SET context = %s WHERE id = %s", updates)
            kinds = kinds_after(meta.get(KINDS_KEY), self.passage_kind, int(meta.get("count", 0)) > 0) if n else {}
            self._set_meta(conn, count=int(meta.get("count", 0)) - gone + n, version=int(meta.get("version", 0)) + 1,
                           encoder=self.encoder_id, next_id=first + n, **kinds)
        return n

    def remove(self, doc_ids: Sequence[str]) -> int:  # PassageStore
        with self._errors("cannot remove from"), self._connection(write=True) as conn, conn.transaction():
            meta = self._lock(conn)
            n = Q.delete_documents(conn, list(doc_ids))
            self._set_meta(conn, count=int(meta.get("count", 0)) - n, version=int(meta.get("version", 0)) + 1)
        return n

    @contextmanager
    def writing(self, wait: bool = True) -> Iterator[None]:
        """Hold the writers' lock for a whole indexing run (reentrant): writers elsewhere wait ``lock_timeout``
        seconds (none if not ``wait``), then fail with a StoreError; this thread's adds use the lock's connection."""
        with held(self._write_lock, wait, self.location):
            if self._writer is not None:
                yield
                return
            with ExitStack() as stack:
                with self._errors("cannot lock"):  # through the breaker: an outage fails it as it fails a question
                    conn = stack.enter_context(self._breaker.connection(self.pool, None))
                    Q.acquire(conn, self.lock_timeout if wait else 0.0, self.location)
                self._writer, self._writer_thread = conn, threading.get_ident()
                version = self.version
                try:
                    yield
                    if self.version != version:  # the run committed: record what the graph does not reach
                        reachability.record_pg(self)
                finally:
                    self._writer = self._writer_thread = None
                    with suppress(self._psycopg.Error):
                        conn.execute("SELECT pg_advisory_unlock(%s)", (Q.WRITER_LOCK,))

    def recount(self) -> None:
        """Re-read the count and the passages searched exactly at the next search (the TTL cut short)."""
        self._counted_at = -Q.COUNT_TTL_S

    def close(self) -> None:
        self._breaker.close()
        self.pool.close()

    def __repr__(self) -> str:
        return f"PgStore({self.location!r}, dim={self.dim})"

    # -- internals -----------------------------------------------------------------------------
    def _setup(self, conn, dim: int, encoder_id: str, m: int, ef_construction: int, create: bool) -> dict[str, str]:
        """Create the extension and tables on first use (under the writers' lock: two devices may race)."""
        if conn.execute("SELECT to_regclass(%s)", (Q.PASSAGES,)).fetchone()[0] is None:
            if not create:
                raise StoreError(f"no passage store in {self.location}; index documents into it first (edge-rag index --db)")
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (Q.WRITER_LOCK,))
                if not conn.execute(Q.HAS_STORE).fetchone()[0]:  # another device may have made it meanwhile
                    if not conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
                        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                    conn.execute(Q.SCHEMA.format(dim=int(dim), m=int(m), ef_construction=int(ef_construction)))
                    self._set_meta(conn, dim=dim, encoder=encoder_id, count=0, version=0, **{STORE_ID: new_identity()})
        self.full_text = Q.upgrade(conn)
        Q.check_locale(conn, self.location)
        return self._meta(conn)

    def _lock(self, conn) -> dict[str, str]:
        """Inside a transaction: wait for the writers' lock, then the meta as committed (checked: made meanwhile?).
        A writer waits for other sessions' locks as long as its session would without ``pgsql.LOCK_WAIT_S``."""
        conn.execute("SET LOCAL lock_timeout TO DEFAULT")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (Q.WRITER_LOCK,))
        check_meta(meta := self._meta(conn), self.dim, self.encoder_id, self.location, "database")
        return meta

    @contextmanager
    def _connection(self, write: bool = False) -> Iterator:
        """The writer's connection inside this thread's ``writing()``, else one from the pool (through the breaker;
        a read is cut at pgsql.READ_WAIT_S)."""
        if self._writer is not None and self._writer_thread == threading.get_ident():
            yield self._writer
        else:
            with self._breaker.connection(self.pool, None if write else Q.READ_WAIT_S) as conn:
                yield conn

    def _meta(self, conn=None) -> dict[str, str]:
        if conn is None:
            with self._errors("cannot read"), self._connection() as pooled:
                return self._meta(pooled)
        return dict(conn.execute(f"SELECT key, value FROM {Q.META}").fetchall())

    _set_meta = staticmethod(Q.set_meta)

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """psycopg errors as StoreErrors naming the store by its masked URL (pgsql.store_error)."""
        try:
            yield
        except self._psycopg.Error as exc:
            raise Q.store_error(self._psycopg, exc, f"{what} store {self.location}", self._url) from None

