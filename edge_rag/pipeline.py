"""EdgeRAG: load a bundle and a passage store, index documents, answer questions.

Read ``ask`` top to bottom: every stage is one call into its own module, timed, and what it decided
is recorded in the Answer.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from . import bundle as B
from .budget import peak_rss_mb
from .chunk import chunk as chunk_document
from .chunk import iter_files, make_document, read_documents
from .config import Config
from .encode import Encoder
from .errors import InputError
from .generate import Generator
from .models import default_bundle
from .store import Store
from .types import Answer, Document, Passage, PassageRef, Route

MAX_QUESTION_CHARS = 2000
INDEX_BATCH_PASSAGES = 1024  # passages encoded and committed together while indexing


class EdgeRAG:
    """Question answering over the documents in ``db`` with the models in ``bundle``."""

    def __init__(self, db: str | Path, bundle: str | Path | None = None, config: Config | None = None,
                 profile: str = "gemma") -> None:
        self.config = config or Config()
        self.bundle = B.Bundle.load(bundle or default_bundle(profile))
        info = self.bundle.encoder
        self.encoder = Encoder(
            self.bundle.require(B.ROLE_ENCODER),
            self.bundle.require(B.ROLE_TOKENIZER),
            max_seq_len=min(self.config.max_seq_len, int(info.get("max_seq_len", 256))),
            batch_tokens=self.config.encode_batch_tokens,
            threads=self.config.threads,
        )
        encoder_sha = next(f["sha256"] for f in self.bundle.files() if f["role"] == B.ROLE_ENCODER)
        c = self.config
        self.store = Store(db, self.encoder.dim, encoder_sha, c.hnsw_m, c.hnsw_ef_construction, c.hnsw_ef_search)
        self._generator: Generator | None = None

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
        """Fixed-k baseline: retrieve k passages, put them all in the prompt, generate."""
        question = check_question(question)
        c = self.config
        timings: dict[str, float] = {}
        with _timed(timings, "encode"):
            vector = self.encoder.encode_one(question)
        with _timed(timings, "retrieve"):
            passages = self.store.search(vector, c.baseline_k)
        context = build_context(passages)
        with _timed(timings, "generate"):
            spec = c.tier(c.fallback_tier)
            gen = self.generator.generate(question, context, spec.max_new_tokens, c.temperature, c.top_k, c.seed,
                                          c.repeat_ngram, c.repeat_window)
        return Answer(
            question=question,
            answer=gen.text or None,
            route=Route.GPT,
            tier=c.fallback_tier,
            d_min=min((p.distance for p in passages), default=float("nan")),
            passages=[PassageRef(p.id, p.title, p.score) for p in passages],
            context_chars=len(context),
            prompt_tokens=gen.prompt_tokens,
            completion_tokens=gen.completion_tokens,
            timings_ms=timings,
            peak_rss_mb=peak_rss_mb(),
            context=context,
        )

    def close(self) -> None:
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


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = timings.get(stage, 0.0) + (time.perf_counter() - start) * 1e3
