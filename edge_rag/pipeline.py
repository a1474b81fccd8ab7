"""EdgeRAG: load a bundle and a passage store, index documents, answer questions.

Read ``ask`` top to bottom: every stage is one call into its own module, timed, and what it decided
is recorded in the Answer, which is built once, at the end.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from pathlib import Path

from tqdm import tqdm

from . import errors
from .config import Config
from .decision.certified import CertifiedPath
from .decision.gate import sequential_gate
from .decision.outcome import Decision, Stages
from .decision.policy import decide
from .documents.files import read_files
from .documents.indexing import Progress, Todo, as_document, held_bytes, index, plan_changes, plan_files
from .errors import BudgetError, InputError, check_kinds, check_question, check_seconds, one_or_many, open_only
from .events import EventStream, Final, RouteDecided, Token
from .memory import plan, runtime_base_estimate, stored_passages
from .memory.hold import admitting, hold, swap
from .models import bundle as B
from .models.registry import default_bundle
from .models.verify import select_encoder
from .reading.extract import extract
from .reading.generate import Generation, Generator
from .retrieval import retrieve
from .retrieval.compress import build_context, compress, dedupe
from .retrieval.encode import Encoder
from .retrieval.rerank import rerank
from .retrieval.route import Router, choose_tier, correct, search_width
from .storage.cache import AnswerCache
from .storage.dburl import is_remote
from .storage.store import Store
from .storage.stores import open_store
from .types import Answer, Document, Route


class EdgeRAG(errors.ProcessBound):
    """Question answering over the documents in ``db`` with the models in ``bundle``.

    Thread-safe: ``ask``/``decide`` may run in many threads at once (encoding, retrieval and extraction in parallel;
    generation one at a time on the single llama.cpp context). ``create=False`` refuses a ``db`` that holds no store;
    ``lock_timeout`` is how long indexing waits for another process's. ``calibration``: a file of ``edge-rag calibrate``
    certifying the decision on this device's own questions (default: the shipped calibration, certified on SQuAD-2
    questions); made under other decision inputs than ``config`` (calibrated_config.DECISION_INPUTS), it certifies
    nothing and every question is refused saying why. ``bundle``: a folder (verified here) or a loaded Bundle.
    ``generator``: another EdgeRAG's llama.cpp model, used if it is this bundle's GGUF at the planned n_ctx.
    """

    def __init__(self, db: str | Path, bundle: str | Path | B.Bundle | None = None, config: Config | None = None,
                 profile: str = "gemma", create: bool = True, lock_timeout: float = 0.0,
                 calibration: str | Path | None = None, generator: Generator | None = None) -> None:
        check_kinds("EdgeRAG", db=(db, str, os.PathLike), bundle=(bundle, str, os.PathLike, B.Bundle, None),
                    config=(config, Config, None), profile=(profile, str), lock_timeout=(lock_timeout, int, float),
                    calibration=(calibration, str, os.PathLike, None))  # a kiosk app's settings come from JSON
        check_seconds(lock_timeout, "EdgeRAG's lock_timeout")
        self.bundle = bundle if isinstance(bundle, B.Bundle) else B.Bundle.load(bundle or default_bundle(profile))
        # Plan the process into the memory budget before loading anything large (BudgetError names what does not fit),
        # its base measured before the encoder is verified: a first run loads it, and the RSS kept of that counted.
        config, remote = config or Config(), is_remote(db)  # a PostgreSQL store's index is off the device: not planned
        certified = CertifiedPath(self.bundle, config, Path(calibration) if calibration else None, remote)
        sized = partial(plan, self.bundle, config, passages=0 if remote else stored_passages(db), remote_index=remote,
                        generator=certified.may_generate, base_mb=runtime_base_estimate().mb)
        sized()  # refused before verifying: the fp32 twin verify may choose instead is larger
        self._encoder_path = select_encoder(self.bundle, config.threads)  # verified here
        self.plan = sized(encoder=self._encoder_path)  # it prices the encoder file chosen
        self.config = self.plan.apply(config)
        self.certified, c = certified.planned(self.config), self.config
        self.plan_lock = threading.Lock()  # the plan and the certified path it sizes change together (memory.hold)
        self.encoder = Encoder(self._encoder_path, self.bundle.require(B.ROLE_TOKENIZER),
                               min(c.max_seq_len, int(self.bundle.encoder.get("max_seq_len", 256))),
                               c.encode_batch_tokens, c.threads)
        encoder_sha = next(f["sha256"] for f in self.bundle.files() if self.bundle.root / f["name"] == self._encoder_path)
        self.store = open_store(db, self.encoder.dim, encoder_sha, self.config, create, lock_timeout)
        if isinstance(self.store, Store):  # another process's commit is loaded only if the plan holds it
            self.store.admit = admitting(self)
        self.certified.check_store(self.store)
        held = generator if self.plan.generator and generator else None
        self._generator = held if held and held.serves(self.bundle.path(B.ROLE_GENERATOR), c.n_ctx) else None
        self._generator_lock, self.closed, self.pid = threading.Lock(), False, os.getpid()  # pid: errors.open_only
        self.router = Router(path, threads=1) if (path := self.bundle.path(B.ROLE_ROUTER)) else None
        self.cache = AnswerCache(self.config, Path(db) / "answers.sqlite" if c.persistent_cache and not remote else None)

    # -- indexing ------------------------------------------------------------------------------
    @open_only
    def add_documents(self, documents: Iterable[Document | str] | Document | str, progress: bool | Progress = False,
                      source: str = "", encoder: Encoder | None = None) -> int:
        """Chunk, embed and store documents, or one (plain strings become untitled documents).

        Documents already in the store (same id and text) are skipped; one stored under the same id with another text is
        replaced. ``source`` names where they all came from (an uploaded file's name): documents stored from that source
        before and absent now are removed, as when a file is re-indexed. ``progress``: a progress bar, or a callback
        (passages done, planned). ``encoder``: another session of this encoder (``indexing_encoder``) so indexing does
        not share the question path's threads. Returns passages added."""
        docs = [as_document(d) for d in one_or_many(documents, (str, Document), "documents")]
        with self.store.writing():
            # Counted in full (they are in memory already); files are counted only up to what fits.
            changes = plan_changes(self.store, docs, self.config, source)
            return self._index(*changes, progress, encoder, sum(map(held_bytes, docs)))

    @open_only
    def add_files(self, paths: Iterable[str | Path] | str | Path, progress: bool | Progress = False, strict: bool = False,
                  on_skip: Callable[[Path, str], None] | None = None) -> int:
        """Index text, Markdown, JSON/JSONL, PDF and HTML files, or one (folders are searched recursively). A file
        indexed before is synchronised: its changed documents replace the old ones, vanished ones are removed.
        Files that cannot be read are skipped and reported to ``on_skip`` (default: a warning); ``strict``
        raises on the first one."""
        files = one_or_many(paths, (str, os.PathLike), "paths")
        with self.store.writing():
            room, text_room = self._room(), self.plan.text_room(self._held(0), self.config, self.encoder.dim)
            todo, remove = plan_files(self.store, read_files(files, strict, on_skip), self.config, room, strict, on_skip,
                                      text_room)
            return self._index(todo, remove, progress, text_bytes=sum(held_bytes(t.doc) for t in todo))

    @open_only
    def remove(self, doc_ids: str | Iterable[str]) -> int:
        """Remove documents by id (an unknown id is an InputError); returns the passages removed."""
        ids = one_or_many(doc_ids, (str,), "document ids")
        with self.store.writing():
            unknown = [i for i in ids if self.store.document(i) is None]
            if unknown:
                raise InputError(f"no document with id {unknown[0]!r} in the store at {self.store.location}")
            return self.store.remove(ids) if ids else 0  # none: a commit rewrote the index, lost every cached answer

    def _room(self) -> int:
        """How many more passages the memory plan can index."""
        return self.plan.room(self._held(0), self.config, self.encoder.dim)

    def _held(self, new: int) -> int:
        """Passages the plan holds after ``new`` more (a remote store's index is on the server: new texts only)."""
        return new if self.plan.remote_index else self.store.count + new

    def indexing_encoder(self) -> Encoder:
        """A second session of the question encoder, to index beside questions: Config.index_threads, in the plan."""
        if not self.config.index_threads:
            raise BudgetError("no second encoder session is in this EdgeRAG's memory plan: Config(index_threads=1)")
        return Encoder(self._encoder_path, self.bundle.require(B.ROLE_TOKENIZER), self.encoder.max_seq_len,
                       self.encoder.batch_tokens, self.config.index_threads)

    def _index(self, todo: list[Todo], remove: list[str], progress: bool | Progress, encoder: Encoder | None = None,
               text_bytes: int = 0) -> int:
        """``todo`` indexed under a plan holding its passages and ``text_bytes`` of documents, or a BudgetError."""
        total = sum(t.units for t in todo)
        try:
            hold(self, self.plan.with_passages(self._held(total), self.config, self.encoder.dim, text_bytes), encoder)
        except BudgetError as exc:
            room, text_room = self._room(), self.plan.text_room(self._held(0), self.config, self.encoder.dim)
            if total > room or text_bytes > text_room:  # add_files stops reading there: the rest is not counted
                raise BudgetError(f"{exc} — at least: {total} new passages and {text_bytes} bytes of documents so far, "
                                  f"past the {room} passages or {text_room} bytes that fit") from None
            raise
        with tqdm(total=total, unit="passage", disable=progress is not True or not total, desc="indexing") as bar:
            def report(done: int, planned: int) -> None:
                bar.update(done - bar.n)
                if callable(progress):
                    progress(done, planned)
                if self.closed:  # by another thread: a cancel (open_only says closed), not encoding on to the next commit
                    raise RuntimeError("closed while indexing")  # with the writer lock held (Store.close)

            return index(self.store, encoder or self.encoder, self.config, todo, remove, report, self.plan.commit_bytes)

    # -- answering -----------------------------------------------------------------------------
    @open_only  # closed, it loaded models no question could use
    def warm_up(self) -> None:
        """Load now what the first question would (the certified reader; llama.cpp where a question may be
        generated): the kiosk and the demo call it first, whose first read took ~10× a warm one."""
        if self.config.reads_neural:
            self.certified.neural_reader()
        if self.certified.may_generate:
            _ = self.generator

    @property
    @open_only
    def generator(self) -> Generator:
        """llama.cpp model, loaded on first use (the extractive route never needs it)."""
        with self._generator_lock:  # many threads may ask at once: load it exactly once
            if self._generator is None:
                if not self.plan.generator:
                    raise BudgetError("llama.cpp is not in this EdgeRAG's memory plan: its calibration does not certify "
                                      "generated answers, so no question is generated (Config(certified=False) does)")
                self._generator = Generator.of(self.bundle.current(B.ROLE_GENERATOR), self.bundle.generator, self.config)
                if self.closed:  # close() ran while it loaded: the closed EdgeRAG held the model close() drops
                    self._generator = None
                    raise RuntimeError("closed while llama.cpp loaded")  # open_only's StoreError: it was closed
            return self._generator

    def ask(self, question: str) -> Answer:
        """Answer one question: cache → encode → retrieve → route (+ correct) → rerank → dedupe + compress → read →
        certify: RAG | GPT (generate) | REFUSE (the seeds' path: evidence gate → extract → CGR instead of read → certify)."""
        *_, final = self.ask_stream(question)
        assert isinstance(final, Final)  # the stream always ends with the Answer
        return final.answer

    @open_only
    def ask_stream(self, question: str) -> EventStream:
        """``ask`` as it happens: the route once decided, whole sentences as llama.cpp generates them (GPT route
        only), then the final Answer (``edge_rag.events``)."""
        question, stages = check_question(question), Stages(self.config.rss_per_stage)
        with stages("cache"):
            certified = self.certified  # decided under this calibration to the end, even if another is swapped in
            cached = self.cache.get(question, version := certified.cache_version(self.store))
        if cached is not None:
            yield RouteDecided(cached.route, cached.tier, cache_hit=True)
            yield Final(replace(cached, question=question, **stages.finish()))
            return
        decision = self._decide(question, stages, certified)
        yield RouteDecided(decision.route, decision.tier)
        gen: Generation | None = None
        if decision.route is Route.GPT:
            c = self.config
            with stages("generate"):
                for piece in self.generator.stream(question, decision.context, c.tier(decision.tier).max_new_tokens,
                                                   c.temperature, c.top_k, c.seed, c.repeat_ngram, c.repeat_window,
                                                   lambda: self.closed):  # close() ends it at the next token
                    if isinstance(piece, str):
                        yield Token(piece)
                    else:  # the last: the whole Generation
                        gen = piece
        answer = decision.answer(question, stages, gen)
        self.cache.put(question, answer, version)  # the version it was computed on, not a commit's since
        yield Final(answer)

    @open_only
    def decide(self, question: str) -> Answer:
        """Everything up to the route, without generating: the RAG answer, a refusal, or a GPT route
        whose context is ready (``ask`` then generates). Cheap: milliseconds, no LLM call."""
        question, stages = check_question(question), Stages(self.config.rss_per_stage)
        return self._decide(question, stages, self.certified).answer(question, stages)

    @open_only  # it reads the store's version: closed, a StoreError, not sqlite3's
    def use_calibration(self, calibration: Path, max_error_rate: float) -> None:
        """Decide the next questions under ``calibration`` at ``max_error_rate`` (CertifiedPath.swapped)."""
        swap(self, self.certified.swapped(calibration, max_error_rate, self.store), calibration)

    def _decide(self, question: str, stage: Stages, certified: CertifiedPath) -> Decision:
        """The stages up to the route, timed into ``stage``, by ``certified``; what they decided, not yet an Answer."""
        c = self.config  # one search wide enough for any tier (the router reads its profile), begun before encoding:
        search = retrieve.begin(self.store, question, search_width(c), c) if c.retrieval != "none" else None
        with stage("encode"):  # its lexical half runs meanwhile (retrieve.begin)
            vector = self.encoder.encode_one(question)
        found = retrieve.Retrieved([], None)
        if search is not None:
            with stage("retrieve"):
                found = search.finish(vector)
        hits = found.passages
        with stage("route"):
            tier, spec, fallback = choose_tier(vector, question, hits, self.router, c)
        passages, corrected = correct(hits, spec.k, tier, c)
        if hits and c.rerank and spec.rerank:
            with stage("rerank"):
                passages = rerank(question, passages, c)
        with stage("compress"):
            if c.compression:
                passages = dedupe(passages, c.dedupe_prefix_chars)
                packed = compress(question, passages, spec.context_chars, c.compression_floor)
                context, used = packed.text, [p for p in passages if p.id in packed.passage_ids]
            else:
                context, used = build_context(passages), passages
        d_min = found.d_min  # the nearest passage by the dense search, whatever the tier kept

        route, reason, gate, extraction, verdict = Route.GPT, None, None, None, None
        if c.certified_decision:
            with stage("read"):
                # from the search's own top hits, not the tier's passages: what the calibration measured
                candidate = certified.read(question, hits, used, self.store, d_min)
            with stage("certify"):
                certified.check_store(self.store)  # another process may have added other passages since
                verdict = certified.decide(question, d_min, candidate, hits)
            route, reason = verdict.route, verdict.reason
        elif c.cgr:
            with stage("gate"):
                gate = sequential_gate([p.score for p in hits[: c.gate_max_n]], c)
            with stage("extract"):
                extraction = extract(question, hits[: c.baseline_k])  # the search's top k, as the certified reader
            route, reason = decide(d_min, gate, extraction, c)
        return Decision(route, reason, tier, fallback, used, context, d_min, corrected, gate, extraction, verdict, hits)

    def answer(self, question: str) -> Answer:
        """cautious-rag style alias: ``rag.answer(q).confident``, ``.lower_bound``, ``.threshold``."""
        return self.ask(question)

    def close(self) -> None:
        self.closed, self._generator = True, None  # its llama.cpp model, most of its RSS: now, not once it is dropped
        if self.pid == os.getpid():  # a forked child's are its parent's: a lock held at the fork would hang it for good
            self.cache.close()
            self.store.close()

    def __enter__(self) -> EdgeRAG:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
