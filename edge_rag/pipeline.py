"""EdgeRAG: load a bundle and a passage store, index documents, answer questions.

Read ``ask`` top to bottom: every stage is one call into its own module, timed, and what it decided
is recorded in the Answer, which is built once, at the end.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from . import bundle as B
from .cache import AnswerCache
from .chunk import chunk as chunk_document
from .chunk import iter_files, make_document, read_documents
from .compress import compress, dedupe
from .config import Config, Tier
from .dburl import is_remote
from .decision import Decision, Stages
from .encode import Encoder
from .errors import InputError
from .extract import extract
from .gate import sequential_gate
from .generate import Generator
from .memory import plan, stored_passages
from .models import default_bundle
from .policy import decide
from .rerank import rerank
from .route import Router, choose_tier
from .stores import open_store
from .types import Answer, Document, Passage, Route

MAX_QUESTION_CHARS = 2000
INDEX_BATCH_PASSAGES = 1024  # passages encoded and committed together while indexing


class EdgeRAG:
    """Question answering over the documents in ``db`` with the models in ``bundle``."""

    def __init__(self, db: str | Path, bundle: str | Path | None = None, config: Config | None = None,
                 profile: str = "gemma") -> None:
        self.bundle = B.Bundle.load(bundle or default_bundle(profile))
        # Plan the whole process into the memory budget before loading anything large: the plan picks
        # n_ctx and the encoder batch that fit, or raises BudgetError naming the component that does not.
        config = config or Config()
        remote = is_remote(db)  # a PostgreSQL store keeps its index off the device: the plan leaves it out
        self.plan = plan(self.bundle, config, passages=0 if remote else stored_passages(db), remote_index=remote)
        self.config = self.plan.apply(config)
        info = self.bundle.encoder
        self.encoder = Encoder(
            self.bundle.require(B.ROLE_ENCODER),
            self.bundle.require(B.ROLE_TOKENIZER),
            max_seq_len=min(self.config.max_seq_len, int(info.get("max_seq_len", 256))),
            batch_tokens=self.config.encode_batch_tokens,
            threads=self.config.threads,
        )
        encoder_sha = next(f["sha256"] for f in self.bundle.files() if f["role"] == B.ROLE_ENCODER)
        self.store = open_store(db, self.encoder.dim, encoder_sha, self.config)
        self._generator: Generator | None = None
        router_path = self.bundle.path(B.ROLE_ROUTER)
        self.router = Router(router_path, threads=1) if router_path else None
        cache_file = Path(db) / "answers.sqlite" if self.config.persistent_cache and not remote else None
        self.cache = AnswerCache(self.config, cache_file)
        self._config_key = hashlib.sha1(repr(self.config).encode()).hexdigest()[:12]

    # -- indexing ------------------------------------------------------------------------------
    def add_documents(self, documents: Iterable[Document | str], progress: bool = False) -> int:
        """Chunk, embed and store documents (plain strings become untitled documents).

        Documents already in the store (same title and text) are skipped. Returns passages added.
        """
        docs = [d if isinstance(d, Document) else make_document(d) for d in documents]
        fresh: dict[str, Document] = {}
        for d in docs:
            if d.text.strip() and d.doc_id not in fresh and not self.store.has_document(d.doc_id):
                fresh[d.doc_id] = d
        units = [chunk_document(d, self.config.passage_mode, self.config.min_sentence_chars) for d in fresh.values()]
        total = sum(len(u) for u in units)
        held = total if self.plan.remote_index else self.store.count + total  # remote: only the new texts
        self.plan = self.plan.with_passages(held, self.config, self.encoder.dim)
        added = 0
        with tqdm(total=total, unit="passage", disable=not progress, desc="indexing") as bar:
            for batch_docs, batch_units in _batches(list(fresh.values()), units, INDEX_BATCH_PASSAGES):
                texts = [t for u in batch_units for t in u]
                added += self.store.add(batch_docs, batch_units, self.encoder.encode(texts))
                bar.update(len(texts))
        return added

    def add_files(self, paths: Iterable[str | Path], progress: bool = False) -> int:
        """Index text, Markdown and JSON/JSONL files (folders are searched recursively)."""
        docs = [d for path in iter_files(paths) for d in read_documents(path)]
        return self.add_documents(docs, progress=progress)

    # -- answering -----------------------------------------------------------------------------
    @property
    def generator(self) -> Generator:
        """llama.cpp model, loaded on first use (the extractive route never needs it)."""
        if self._generator is None:
            self._generator = Generator(
                self.bundle.require(B.ROLE_GENERATOR),
                prompt_style=self.bundle.generator.get("prompt_style", "one-shot"),
                n_ctx=self.config.n_ctx,
                threads=self.config.threads,
                seed=self.config.seed,
            )
        return self._generator

    def ask(self, question: str) -> Answer:
        """Answer one question: cache → encode → route → retrieve (+ correct) → rerank → dedupe →
        compress → evidence gate → extract → CGR: RAG | GPT (generate) | REFUSE."""
        question = check_question(question)
        stages = Stages(self.config.rss_per_stage)
        with stages("cache"):
            cached = self.cache.get(question, self._cache_version())
        if cached is not None:
            return replace(cached, question=question, **stages.finish())
        decision = self._decide(question, stages)
        gen = None
        if decision.route is Route.GPT:
            c = self.config
            with stages("generate"):
                gen = self.generator.generate(question, decision.context, c.tier(decision.tier).max_new_tokens,
                                              c.temperature, c.top_k, c.seed, c.repeat_ngram, c.repeat_window)
        answer = decision.answer(question, stages, gen)
        self.cache.put(question, answer, self._cache_version())
        return answer

    def decide(self, question: str) -> Answer:
        """Everything up to the route, without generating: the RAG answer, a refusal, or a GPT route
        whose context is ready (``ask`` then generates). Cheap: milliseconds, no LLM call."""
        question = check_question(question)
        stages = Stages(self.config.rss_per_stage)
        return self._decide(question, stages).answer(question, stages)

    def _decide(self, question: str, stage: Stages) -> Decision:
        """The stages up to the route, timed into ``stage``; what they decided, not yet an Answer."""
        c = self.config
        with stage("encode"):
            vector = self.encoder.encode_one(question)
        with stage("route"):
            tier, spec, fallback = choose_tier(vector, self.router, c)
        passages: list[Passage] = []
        scores: list[float] = []
        corrected = False
        if c.retrieval:
            with stage("retrieve"):
                hits = self.store.search(vector, max(spec.k + c.correction_extra_k, c.gate_max_n))
                scores = [p.score for p in hits]
                passages, corrected = correct(hits, spec.k, tier, c)
            if c.rerank and spec.rerank:
                with stage("rerank"):
                    passages = rerank(question, passages, c)
        with stage("compress"):
            if c.compression:
                passages = dedupe(passages, c.dedupe_prefix_chars)
                packed = compress(question, passages, spec.context_chars)
                kept = set(packed.passage_ids)
                context, used = packed.text, [p for p in passages if p.id in kept]
            else:
                context, used = build_context(passages), passages
        d_min = min((p.distance for p in passages), default=math.nan)

        route, reason, gate, extraction = Route.GPT, None, None, None
        if c.cgr:
            with stage("gate"):
                gate = sequential_gate(scores[: c.gate_max_n], c)
            with stage("extract"):
                extraction = extract(question, used)
            route, reason = decide(d_min, gate, extraction, c)
        return Decision(route, reason, tier, fallback, used, context, d_min, corrected, gate, extraction)

    def answer(self, question: str) -> Answer:
        """cautious-rag style alias: ``rag.answer(q).confident``, ``.lower_bound``, ``.threshold``."""
        return self.ask(question)

    def _cache_version(self) -> str:
        """Cached answers are valid for this corpus and this configuration only."""
        return f"{self.store.version}:{self._config_key}"

    def close(self) -> None:
        self.cache.close()
        self.store.close()

    def __enter__(self) -> EdgeRAG:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_question(question: str) -> str:
    """A usable question, or InputError saying why not."""
    if not isinstance(question, str) or not question.strip():
        raise InputError("the question is empty")
    question = " ".join(question.split())
    if len(question) > MAX_QUESTION_CHARS:
        raise InputError(f"the question is {len(question)} characters; the limit is {MAX_QUESTION_CHARS}")
    return question


def build_context(passages: list[Passage]) -> str:
    """One line per passage, prefixed by its title, in rank order."""
    return "\n".join(f"{p.title}: {p.text}" if p.title else p.text for p in passages)


def _batches(docs: list[Document], units: list[list[str]], size: int) -> Iterator[tuple[list, list]]:
    """Whole documents grouped until about ``size`` passages."""
    bd: list[Document] = []
    bu: list[list[str]] = []
    for d, u in zip(docs, units):
        bd.append(d)
        bu.append(u)
        if sum(len(x) for x in bu) >= size:
            yield bd, bu
            bd, bu = [], []
    if bd:
        yield bd, bu


def correct(hits: list[Passage], k: int, tier: Tier, config: Config) -> tuple[list[Passage], bool]:
    """Thesis correction: a weak best match (s_1 < threshold) on a non-HARD tier gets k_extra more passages."""
    weak = bool(hits) and hits[0].score < config.correction_threshold
    if config.correction and weak and tier is not Tier.HARD:
        return hits[: k + config.correction_extra_k], True
    return hits[:k], False
