"""The certified decision path: read a candidate answer, score it, route it against the threshold that
keeps the error among answered questions <= Config.max_error_rate with probability >= 1 - Config.delta
(certify.py says exactly what that covers: exchangeable calibration questions, not each question)."""
from __future__ import annotations

import copy
import hashlib
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import onnxruntime as ort

from ..config import Config
from ..errors import BundleError
from ..models import bundle as B
from ..models import verify
from ..reading.read import NOTHING, Candidate, NeuralReader, paragraphs, read_rules, reader_path
from ..reading.reader import MAX_SEQ_LEN as READER_SEQ_LEN
from ..reading.reader import reader_file
from ..storage.fileio import sha256_file
from ..storage.stores import PassageStore, Stamped
from ..types import Passage, Route
from .calibrated_config import (
    UNRECORDED,
    backend_change,
    config_change,
    encoder_change,
    generation_change,
    store_change,
)
from .certify import Calibration, Certificate, ReaderCalibration, beyond_floor, shipped_calibration
from .kind import Kind
from .policy import decide_certified


@dataclass(frozen=True)
class State:
    """What certifies this path's answers: the single-hop questions' certificate (None: nothing), why every question
    is refused when nothing is, why generated answers are not certified while the reader's are, and each kind's
    certificate."""

    by_kind: dict[Kind, Certificate]  # empty: nothing is certified
    uncertified: str | None
    generation: str | None = None

    @property
    def gpt_refused(self) -> str | None:
        """Why generated answers are not certified (None: they are)."""
        return self.uncertified or self.generation

    @property
    def certificate(self) -> Certificate | None:
        return self.by_kind.get(Kind.SINGLE_HOP)


@dataclass(frozen=True)
class Verdict:
    """The read stage's candidate and what the certified policy made of it (Answer fields in ``fields``)."""

    candidate: Candidate
    route: Route
    reason: str | None
    fields: dict = field(default_factory=dict)


class CertifiedPath:
    """The calibration, the reader (loaded on first use) and this config's certificate. A calibration measured
    under other decision inputs than ``config`` (calibrated_config.DECISION_INPUTS), another encoder or another
    reader model, or on other kinds of passages than the store holds (``check_store``), certifies nothing: every
    question is refused with the reason in ``uncertified``. A file that records no Config (``edge-rag calibrate``
    before it recorded one) still loads, unchecked. Generated answers are certified only at an alpha their own counts
    meet, from the generator and generation settings they were counted with (``gpt_refused`` says why not)."""

    def __init__(self, bundle: B.Bundle, config: Config, calibration: Path | None = None,
                 remote: bool = False) -> None:
        """``calibration``: a file of ``edge-rag calibrate`` (it must exist), or None for the shipped one of the
        store's kind (``remote``: PostgreSQL)."""
        self.bundle, self.config = bundle, config
        self.own, self.remote = calibration is not None, remote
        self.shipped = shipped_calibration(remote)  # what an own calibration takes its score and floor from
        self.calibration_path = Path(calibration) if calibration is not None else self.shipped
        if calibration is not None and not self.calibration_path.is_file():
            what = "is not a file" if self.calibration_path.exists() else "does not exist"  # a folder, a pipe
            raise BundleError(f"calibration file {calibration} {what} (make one with `edge-rag calibrate`)")
        # A missing shipped calibration refuses every question (with that reason), never answers uncertified.
        cal = Calibration.load(self.calibration_path) if self.calibration_path.is_file() else None
        self.calibration: Calibration | None = cal
        # cached answers were decided under one calibration: its hash is part of the cache's key
        self.calibration_sha256 = sha256_file(self.calibration_path) if cal is not None else None
        # why every question is refused (no reason: the calibration certifies this config, whatever the store holds)
        if cal is None:
            missing = f"not calibrated: run `python -m convert calibrate{' --backend pgvector' if remote else ''}`"
            self._measured = State({}, missing)
        elif (why := self._mismatch(cal, bundle, config)) is not None:
            self._measured = State({}, why)
        else:
            rc = cal.reader(config.reader)
            by_kind = {kind: rc.certificate(kind, config.max_error_rate, config.delta) for kind in Kind}
            # whether generated answers are certified too: by this generator, at this alpha (a bisection, once,
            # here), generated as this config generates
            gpt = (rc.gpt_refused(config.max_error_rate, config.delta, bundle.generator.get("name"))
                   or generation_change(cal.source, config))
            self._measured = State(by_kind, None, gpt)
        self._state = self._measured
        self._cache_key = _cache_key(config, self.calibration_sha256, self._measured, bundle)
        self._store_stamp: tuple[str, int] | None = None  # as of the store's identity and version last checked
        self._retired: frozenset[str] = frozenset()  # identities of stores made again since: never taken again
        self._state_lock = threading.Lock()
        self._neural: NeuralReader | None = None
        self._neural_lock = threading.Lock()

    def cache_version(self, store: PassageStore) -> str:
        """Cached answers are valid for this corpus, this configuration and this calibration only."""
        identity, version = store.stamp  # a store made again at the same place starts again at version 1
        return f"{identity}:{version}:{self._cache_key}"

    def planned(self, config: Config) -> CertifiedPath:
        """This path under the memory plan's copy of its config, which sizes n_ctx and the encoder batch and changes
        no decision input: the calibration is not read again, nor its certificate chosen again (~20 ms)."""
        if config.with_(n_ctx=self.config.n_ctx, encode_batch_tokens=self.config.encode_batch_tokens) != self.config:
            raise ValueError("a planned config may differ from the path's only in n_ctx and encode_batch_tokens")
        new = copy.copy(self)
        new.config, new._neural_lock, new._state_lock = config, threading.Lock(), threading.Lock()
        new._cache_key = _cache_key(config, self.calibration_sha256, self._measured, self.bundle)
        if new._neural is not None:  # loaded already: it reads in the batch the plan now holds
            new._neural.reader.batch_tokens = max(config.encode_batch_tokens, READER_SEQ_LEN)
        return new

    def swapped(self, calibration: Path, max_error_rate: float, store: PassageStore) -> CertifiedPath:
        """A path deciding under ``calibration`` at ``max_error_rate``, to swap in for this one (EdgeRAG holds one
        reference: a question keeps the path it began with to its end, and the cache key holds the calibration).
        It reads with this path's neural reader once loaded: a second copy would not fit the memory plan."""
        new = CertifiedPath(self.bundle, self.config.with_(max_error_rate=max_error_rate), calibration, self.remote)
        new._neural = self._neural  # None: not loaded yet, the new path loads its own on first use
        new.check_store(store)
        return new

    @property
    def certificate(self) -> Certificate | None:
        return self._state.certificate

    @property
    def gpt_allowed(self) -> bool:
        return self._state.gpt_refused is None

    @property
    def gpt_refused(self) -> str | None:
        """Why generated answers are not certified (None: they are, and a why question may take the GPT route)."""
        return self._state.gpt_refused

    @property
    def may_generate(self) -> bool:
        """Whether a question can take the GPT route: always on the seeds' decision (or none), else only where this
        calibration certifies generated answers at the config's alpha (EdgeRAG plans and loads llama.cpp only then)."""
        return not self.config.certified_decision or self.gpt_allowed

    @property
    def uncertified(self) -> str | None:
        return self._state.uncertified

    def check_store(self, store: Stamped) -> None:
        """Certify nothing, saying why, while the store holds passages cut otherwise than those the calibration
        measured (calibrated_config.store_change). Checked again whenever the store's version moves: another process
        (an upload on the kiosk, `edge-rag index`) may add passages of another kind to a store this one has open, or
        an operator drop it and make it again (another identity, versions from 1)."""
        identity, version = stamp = store.stamp
        cal = self.calibration  # None only once nothing is certified (record_only)
        if stamp != self._store_stamp and self._measured.certificate is not None and cal is not None:
            state = self._measured if (why := store_change(cal.source, store.passage_kinds)) is None else State({}, why)
            with self._state_lock:  # questions check on many threads: one that read an older version never writes last
                last = self._store_stamp
                if last is None or (version > last[1] if identity == last[0] else identity not in self._retired):
                    if last is not None and identity != last[0]:  # dropped and made again: its versions restarted
                        self._retired |= {last[0]}  # and the old store never returns
                    self._state, self._store_stamp = state, stamp

    def record_only(self) -> None:
        """Refuse every question but keep its candidate and features: what calibrating and sweeping the reader
        record, with no certificate deciding."""
        self.calibration = None
        self._measured = self._state = State({}, "recording candidates only (no certificate)")

    def _mismatch(self, cal: Calibration, bundle: B.Bundle, config: Config) -> str | None:
        """Why the loaded calibration does not certify this config (None: it does): it has no entry for its
        reader, was measured under other decision inputs, another encoder or on another kind of store
        (calibrated_config), or with another reader model."""
        if config.reader not in cal.readers:
            return (f"not calibrated for reader {config.reader!r} ({self.calibration_path.name} holds "
                    f"{', '.join(cal.readers)}): calibrate again with this Config (`edge-rag calibrate`)")
        rc = cal.reader(config.reader)
        return (config_change(cal.source, config) or encoder_change(cal.source, bundle)
                or backend_change(cal.source, self.remote)
                or (stale_reader(bundle, rc) if config.reader == "neural" else None))

    def read(self, question: str, passages: list[Passage], context_passages: list[Passage], store,
             d_min: float) -> Candidate:
        """The neural reader over the top passages' paragraphs, or the rule extractor over the compressed context.
        Nothing is read for a question the out-of-domain floor refuses whatever the reader finds: an off-topic
        question then costs no reader call, most of the route's time."""
        c = self.config
        if self._beyond_floor(d_min):
            return NOTHING
        if c.reader == "rules":
            return read_rules(question, context_passages)
        return self.neural_reader()(question, paragraphs(question, passages, store, c.reader_passages, c.reader_window))

    def _beyond_floor(self, d_min: float) -> bool:
        """Whether ``decide`` refuses a question at ``d_min`` as out of domain before looking at its candidate (also
        for NaN: nothing retrieved). Without a certificate (``record_only``, a stale calibration) every question is
        read: calibrating records every candidate."""
        cal = self.calibration
        return (cal is not None and self._state.certificate is not None
                and beyond_floor(d_min, cal.reader(self.config.reader).ood_distance))

    def neural_reader(self) -> NeuralReader:
        """The trained reader, loaded on first use (EdgeRAG.warm_up loads it before the first question)."""
        with self._neural_lock:  # the server's questions arrive on many threads: load it exactly once
            if self._neural is None:
                self._neural = NeuralReader(reader_path(self.bundle), self.bundle.require(B.ROLE_TOKENIZER),
                                            threads=self.config.threads, batch_tokens=self.config.encode_batch_tokens)
            return self._neural

    def decide(self, question: str, d_min: float, candidate: Candidate, passages: list[Passage]) -> Verdict:
        """Score the candidate with the calibrated combiner and route it against the threshold certified for the
        question's kind (kind.py)."""
        c, state = self.config, self._state  # one snapshot: check_store may move it meanwhile
        features = candidate.features(question, passages)
        if state.certificate is None or self.calibration is None:
            return Verdict(candidate, Route.REFUSE, state.uncertified, {"features": features})
        rc = self.calibration.reader(c.reader)
        kind = rc.kind(question)
        cert = state.by_kind[kind]
        score = rc.combiner(features) if candidate.text else math.nan
        route, reason = decide_certified(question, d_min, rc.ood_distance, candidate.text, score, cert,
                                         state.gpt_refused, kind)
        return Verdict(candidate, route, reason, {
            "score": score, "features": features, "alpha": cert.alpha, "delta": cert.delta,
            "score_threshold": cert.threshold, "n_cal": cert.n_cal, "cal_coverage": cert.coverage,
            "cal_error": cert.error, "kind": kind.value})


def _cache_key(config: Config, calibration_sha256: str | None, measured: State, bundle: B.Bundle) -> str:
    """Cached answers were decided under one config, one calibration and the certificates chosen from it, by one
    bundle's models: all four are the cache's key. The certificates too, as the rule choosing them may change with
    edge-rag itself (sharing delta raised the default threshold 0.481 -> 0.499 for the same file): a persisted cache
    must not answer by the old one. The bundle by its manifest (each file's sha256, the generator's settings): another
    installed at the same path (`edge-rag models install`) routes and generates otherwise. And the onnxruntime that
    runs them: its kernels round otherwise from version to version (1.22.1 against 1.32.0 on one CPU: 3 of the 24
    sample questions decided or answered otherwise, "What is Big Mary?" refused by one and answered by the other), and
    the CPU features that pick its kernels: a store moved with its cache (an SD card) to a CPU of another kernel path
    (AVX2 against AVX-512 VNNI, x86 against Arm) rounds the reader's floats otherwise (reader-kernels.md)."""
    return hashlib.sha1(repr((config, calibration_sha256, measured, bundle.manifest, ort.__version__,
                              verify.cpu_features())).encode()).hexdigest()[:12]


def stale_reader(bundle: B.Bundle, calibration: ReaderCalibration) -> str | None:
    """Why the calibration does not certify this bundle's reader (None when it does): its risk table was
    measured with one reader model, and a retrained reader (``make reader`` without ``make calibrate``)
    makes other mistakes at the same scores. The bundle's manifest already holds its reader's sha256."""
    path = reader_file(bundle)
    if not path.is_file():
        return None  # a missing reader fails when it loads
    if calibration.model_sha256 is None:  # its counts may be of any reader
        return f"the calibration records no reader model it was measured with{UNRECORDED}: calibrate again"
    sha = reader_sha256(bundle)
    if sha == calibration.model_sha256:
        return None
    return (f"not calibrated for this reader model ({path.name} sha256 {sha[:12]}, calibrated with "
            f"{calibration.model_sha256[:12]}): run `make calibrate`")


def reader_sha256(bundle: B.Bundle) -> str:
    """The sha256 of the reader ONNX the certified path reads with: the bundle's manifest holds it, else hashed."""
    path = reader_file(bundle)
    entry = next((f for f in bundle.files() if f["role"] == B.ROLE_READER), None)
    return entry["sha256"] if entry and bundle.root / entry["name"] == path else sha256_file(path)
