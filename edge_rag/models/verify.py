"""On-device check of the encoder: re-embed the bundle's reference sentences on THIS CPU.

The same int8 ONNX file gives different vectors under different onnxruntime kernels (AVX-512-VNNI,
AVX2, SSE4, ARM), so a parity figure measured when the bundle was built says little about the device.
The bundle carries fp32 embeddings made by torch at build time for a fixed sentence set
(``reference.npz``); here the bundle's encoder embeds them again and we compare: per-sentence cosine,
and whether each sentence keeps its nearest neighbours within the set (what retrieval depends on).

A verdict is cached per (encoder file hash, CPU features, onnxruntime version): the features come from
numpy's CPUID probe, which reports what the CPU (or emulator) really offers, not /proc/cpuinfo.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..errors import BundleError
from ..retrieval.encode import Encoder
from ..storage.fileio import atomic_write_text
from . import bundle as B
from .manifest import read_json
from .registry import home

VERIFY_VERSION = 1  # bump when thresholds or the measurement change: cached verdicts become stale


@dataclass(frozen=True)
class Thresholds:
    """What an encoder must reach against torch's fp32 vectors on the reference set.

    Cosine bounds are per sentence (mean and worst); ``nn_at5`` is the share of sentences whose nearest
    neighbour in the set (by the reference) is still among the device's 5 nearest, ``top5`` the mean
    overlap of the two 5-nearest lists.
    """

    cosine_mean: float
    cosine_min: float
    nn_at5: float
    top5: float


THRESHOLDS = {
    "fp32": Thresholds(cosine_mean=0.999, cosine_min=0.999, nn_at5=0.99, top5=0.99),
    # Neighbour bounds sit below what passing int8 schemes reach on the build host (NN@5 1.0, top-5
    # 0.90-0.96 over the 64 sample sentences, whose many near-ties swap places at int8 precision).
    "int8": Thresholds(cosine_mean=0.99, cosine_min=0.98, nn_at5=0.95, top5=0.85),
}


@dataclass(frozen=True)
class Verdict:
    precision: str
    sentences: int
    cosine_mean: float
    cosine_min: float
    nn_at5: float
    top5: float
    query_ms: float
    passed: bool
    cpu: str
    onnxruntime: str

    def summary(self) -> str:
        t = THRESHOLDS[self.precision]
        return (f"{self.precision} encoder on {self.cpu}: cosine mean {self.cosine_mean:.4f} (>= {t.cosine_mean}) "
                f"min {self.cosine_min:.4f} (>= {t.cosine_min}), neighbour agreement NN@5 {self.nn_at5:.3f} "
                f"(>= {t.nn_at5}) top-5 {self.top5:.3f} (>= {t.top5}), query {self.query_ms:.1f} ms, "
                f"{self.sentences} sentences: {'PASS' if self.passed else 'FAIL'}")


def save_reference(path: str | Path, texts: list[str], vectors: np.ndarray) -> Path:
    """Write the reference set (host side, vectors from torch) beside the bundle's encoder."""
    np.savez(path, texts=np.array(texts), vectors=np.asarray(vectors, dtype=np.float32))
    return Path(path)


def load_reference(path: str | Path) -> tuple[list[str], np.ndarray]:
    """(sentences, torch's fp32 vectors of them); a file that is not such a pair is a BundleError."""
    try:
        with np.load(path, allow_pickle=False) as data:
            texts, vectors = [str(t) for t in data["texts"]], data["vectors"].astype(np.float32)
    except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:  # not an .npz, a missing array, object arrays
        raise BundleError(f"cannot read the encoder's reference set {path}: {exc}; rebuild the bundle") from exc
    if vectors.ndim != 2 or len(vectors) != len(texts) or not texts:
        raise BundleError(f"the encoder's reference set {path} holds {len(texts)} sentences and vectors of shape "
                          f"{vectors.shape}; rebuild the bundle")
    return texts, vectors


def cpu_features() -> str:
    """Architecture + SIMD features the CPU reports to CPUID (numpy's runtime dispatch probe)."""
    import importlib
    import platform

    try:  # a compiled module without type information: its attributes are Any
        umath = importlib.import_module("numpy._core._multiarray_umath")
    except ImportError:  # numpy < 2
        umath = importlib.import_module("numpy.core._multiarray_umath")
    return platform.machine() + ":" + ",".join(sorted(k for k, on in umath.__cpu_features__.items() if on))


def cpu_label() -> str:
    """Architecture and best SIMD level (e.g. ``x86_64 AVX2``), for messages and reports."""
    arch, feats = cpu_features().split(":", 1)
    best = next((f for f in ("AVX512VNNI", "AVX512F", "AVX2", "AVX", "SSE42", "ASIMDDP", "ASIMD", "NEON")
                 if f in feats.split(",")), "")
    return f"{arch} {best}".strip()


def _nearest(vectors: np.ndarray, k: int) -> np.ndarray:
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def neighbour_agreement(reference: np.ndarray, vectors: np.ndarray) -> tuple[float, float]:
    """Retrieval-style agreement within the set: (share of sentences whose reference nearest neighbour is
    among the device's 5 nearest, mean overlap of the two 5-nearest lists). Near-ties swap places under
    kernel rounding, so the exact top-1 is not asked for."""
    ref, got = _nearest(reference, 5), _nearest(vectors, 5)
    nn_at5 = float(np.mean([r[0] in g for r, g in zip(ref, got)]))
    overlap = float(np.mean([len(set(r) & set(g)) / 5 for r, g in zip(ref, got)]))
    return nn_at5, overlap


def query_latency_ms(encoder: Encoder, texts: list[str], repeats: int = 20) -> float:
    """Median wall time of embedding one sentence (after one warm-up)."""
    encoder.encode_one(texts[0])
    times = []
    for i in range(repeats):
        t = time.perf_counter()
        encoder.encode_one(texts[i % len(texts)])
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def measure(encoder: Encoder, texts: list[str], reference: np.ndarray, precision: str,
            repeats: int = 20) -> Verdict:
    """Embed ``texts`` with ``encoder`` and judge the vectors against ``reference`` (torch, fp32)."""
    vectors = encoder.encode(texts)
    cos = (vectors * reference).sum(axis=1)
    nn_at5, top5 = neighbour_agreement(reference, vectors)
    t = THRESHOLDS[precision]
    passed = bool(cos.mean() >= t.cosine_mean and cos.min() >= t.cosine_min and nn_at5 >= t.nn_at5 and top5 >= t.top5)
    return Verdict(precision, len(texts), float(cos.mean()), float(cos.min()), nn_at5, top5,
                   query_latency_ms(encoder, texts, repeats), passed, cpu_label(), ort.__version__)


def verify_encoder(onnx_path: Path, tokenizer: Path, reference: Path, precision: str, max_seq_len: int = 256,
                   threads: int = 0, repeats: int = 20) -> Verdict:
    texts, vectors = load_reference(reference)
    encoder = Encoder(onnx_path, tokenizer, max_seq_len=max_seq_len, threads=threads)
    if vectors.shape[1] != encoder.dim:
        raise BundleError(f"the reference set {reference} holds {vectors.shape[1]}-float vectors, the encoder makes "
                          f"{encoder.dim}; rebuild the bundle")
    return measure(encoder, texts, vectors, precision, repeats)


def cache_key(measured: Sequence[str | int]) -> str:
    """The cache file's name for a verdict measured from ``measured`` on this CPU and onnxruntime."""
    raw = json.dumps([VERIFY_VERSION, *measured, cpu_features(), ort.__version__])
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def cached_verdict(cache_dir: Path, measured: Sequence[str | int], run: Callable[[], Verdict],
                   refresh: bool = False) -> Verdict:
    """The verdict of ``run`` on this CPU + onnxruntime, for everything it is ``measured`` from (each file's sha256,
    the precision judged, the sequence length): read from ``cache_dir``, else (or with ``refresh``) measured and
    stored. Keyed on the encoder alone, a bundle with another tokenizer reused a PASS it would fail, and verifying a
    bundle that calls the same encoder another precision switched every bundle sharing it to its fp32 twin."""
    path = cache_dir / f"{cache_key(measured)}.json"
    if not refresh:
        with contextlib.suppress(BundleError):
            if (cached := _verdict(read_json(path, "a cached verdict"))) is not None:
                return cached
    verdict = run()
    try:
        atomic_write_text(path, json.dumps(asdict(verdict), indent=2))
    except OSError as exc:  # a read-only home only costs a re-measurement next time
        print(f"edge-rag: could not cache the encoder verdict in {path}: {exc}", file=sys.stderr)
    return verdict


def _verdict(data: object) -> Verdict | None:
    """The Verdict ``data`` records, or None when it is not one (an edited or damaged cache file: measure again)."""
    if not isinstance(data, dict) or set(data) != {f.name for f in fields(Verdict)}:
        return None
    # the field types as written (``from __future__ import annotations``: strings)
    kinds: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "float": (int, float), "bool": bool}
    if any(not isinstance(data[f.name], kinds[str(f.type)]) or (f.type != "bool" and isinstance(data[f.name], bool))
           for f in fields(Verdict)):
        return None
    return Verdict(**data) if data["precision"] in THRESHOLDS else None


def verdict_for(bundle: B.Bundle, role: str, threads: int = 0, cached: bool = True,
                repeats: int = 20) -> Verdict | None:
    """Verify the bundle's ``role`` encoder on this CPU (None when the bundle has no reference set); ``repeats``
    single-sentence runs time a query (an emulated CPU's time means nothing, so its check takes one)."""
    reference = bundle.path(B.ROLE_REFERENCE)
    if reference is None:
        return None
    precision = bundle.encoder.get("precision", "fp32") if role == B.ROLE_ENCODER else "fp32"
    max_len = int(bundle.encoder.get("max_seq_len", 256))

    def run() -> Verdict:
        return verify_encoder(bundle.require(role), bundle.require(B.ROLE_TOKENIZER), reference, precision,
                              max_len, threads, repeats)

    measured = (bundle.sha256(role), bundle.sha256(B.ROLE_TOKENIZER), bundle.sha256(B.ROLE_REFERENCE), precision, max_len)
    return cached_verdict(home() / "verify", measured, run, refresh=not cached)


def verify_bundle(bundle: B.Bundle, threads: int = 0, cached: bool = False) -> list[Verdict]:
    """Verdicts of the bundle's encoder and, when it fails here, of its fp32 fallback."""
    first = verdict_for(bundle, B.ROLE_ENCODER, threads, cached)
    if first is None:
        return []
    fp32 = None
    if not first.passed and bundle.path(B.ROLE_ENCODER_FP32) is not None:
        fp32 = verdict_for(bundle, B.ROLE_ENCODER_FP32, threads, cached)
    return [v for v in (first, fp32) if v is not None]


def select_encoder(bundle: B.Bundle, threads: int = 0) -> Path:
    """The encoder file to run on this CPU: the bundle's encoder when it passes verify here (verdict
    cached), else its fp32 twin with a warning carrying the measured figures — never silently."""
    verdicts = verify_bundle(bundle, threads, cached=True)
    if not verdicts or verdicts[0].passed:
        return bundle.require(B.ROLE_ENCODER)
    if len(verdicts) > 1 and verdicts[1].passed:
        warnings.warn(f"{verdicts[0].summary()}; using the bundle's fp32 encoder instead "
                      f"({verdicts[1].cosine_mean:.4f} mean cosine here)", RuntimeWarning, stacklevel=2)
        return bundle.require(B.ROLE_ENCODER_FP32)
    warnings.warn(f"{verdicts[0].summary()}; the bundle has no passing fp32 encoder, so retrieval on this CPU "
                  "may differ from the build host: rebuild with --precision fp32", RuntimeWarning, stacklevel=2)
    return bundle.require(B.ROLE_ENCODER)


def check_models(bundle: B.Bundle) -> None:
    """Each model opens as what its role says (the GGUF's header; the router's and reader's inputs and outputs): the
    hashes alone let an archive whose generator is no GGUF replace a working bundle that no command could load after,
    and ``models verify`` passed it. The encoder makes the vectors its manifest says: the memory plan prices the index
    by ``encoder.dim``."""
    from ..memory.gguf import read_gguf
    from ..reading.reader import Reader
    from ..retrieval.route import Router

    read_gguf(bundle.require(B.ROLE_GENERATOR))
    for role in (B.ROLE_ENCODER, B.ROLE_ENCODER_FP32):
        if (path := bundle.path(role)) and (dim := Encoder(path, bundle.require(B.ROLE_TOKENIZER)).dim) != bundle.encoder["dim"]:
            raise BundleError(f"{path} makes {dim}-float vectors and the manifest's encoder.dim says "
                              f"{bundle.encoder['dim']} (the memory plan prices the index by it); rebuild the bundle")
    if router := bundle.path(B.ROLE_ROUTER):
        Router(router)
    if reader := bundle.path(B.ROLE_READER):
        Reader(reader, bundle.require(B.ROLE_TOKENIZER), threads=1)
