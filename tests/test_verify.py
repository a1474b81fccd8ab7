"""On-device encoder verification: the bundle's encoder re-embeds torch's reference sentences on this CPU
(natively and under an emulated AVX2-only CPU), verdicts are cached, and a failing int8 encoder falls back
to the fp32 twin with a warning that carries the figures."""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from conftest import EMULATED_SHARE, on_emulated_haswell, reference_share
from onnxruntime.quantization import QuantType, quantize_dynamic

from edge_rag.cli.commands import main
from edge_rag.config import Config
from edge_rag.errors import BundleError
from edge_rag.memory.estimate import ENCODER_HEADS, encoder_estimate
from edge_rag.models import bundle as B
from edge_rag.models import registry as M
from edge_rag.models.verify import (
    THRESHOLDS,
    Verdict,
    cache_key,
    load_reference,
    select_encoder,
    verdict_for,
    verify_bundle,
    verify_encoder,
)
from edge_rag.pipeline import EdgeRAG

ROOT = Path(__file__).resolve().parent.parent
WEAK = ROOT / "tests" / ".cache" / "weak-encoder"  # per_tensor_int8


def linked_bundle(bundle: B.Bundle, out: Path, replace: dict[str, Path], **encoder: object) -> Path:
    """The real bundle assembled again at ``out`` with ``replace``'s files (role → file) in place of its own: every
    other file is linked, not copied (``assemble`` copies no file that already resolves to its source), so no 390 MB
    copy per bundle; the manifest is written and the files hashed as for any bundle."""
    from convert.bundle import assemble

    out.mkdir(parents=True)
    files = {f["role"]: bundle.root / f["name"] for f in bundle.files()} | replace
    for f in bundle.files():
        if f["role"] not in replace:
            (out / f["name"]).symlink_to(bundle.root / f["name"])
    assemble(out, files, "gemma", bundle.encoder | encoder, M.PROFILES[bundle.manifest["profile"]])
    return out


@pytest.fixture(scope="module")
def share_bundle(bundle: B.Bundle, tmp_path_factory: pytest.TempPathFactory) -> B.Bundle:
    """The real bundle with its reference set cut to ``reference_share`` (8 sentences, which the int8 encoder passes
    as it does all 64: test_the_emulated_share_still_fails_a_per_tensor_int8_encoder shows a bad one still fails
    them): a verification costs ~0.4 s of CPU instead of ~1.8, for the tests of what happens around a verdict."""
    out = tmp_path_factory.mktemp("share")
    share = reference_share(bundle, out / "reference.npz")
    return B.Bundle.load(linked_bundle(bundle, out / "b", {B.ROLE_REFERENCE: share}))


def test_bundle_encoder_passes_here(bundle: B.Bundle) -> None:
    [verdict] = verify_bundle(bundle)
    assert verdict.precision == "int8" and verdict.sentences >= 32, verdict
    assert verdict.passed, verdict.summary()
    assert verdict.cosine_min >= THRESHOLDS["int8"].cosine_min and verdict.nn_at5 >= THRESHOLDS["int8"].nn_at5


def test_verdict_is_cached_per_encoder_cpu_and_onnxruntime(share_bundle: B.Bundle, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = share_bundle
    monkeypatch.setenv("EDGE_RAG_HOME", str(tmp_path))
    first = verdict_for(bundle, B.ROLE_ENCODER)
    measured = [bundle.sha256(r) for r in (B.ROLE_ENCODER, B.ROLE_TOKENIZER, B.ROLE_REFERENCE)] + ["int8", 256]
    [stored] = (tmp_path / "verify").glob("*.json")
    assert stored.stem == cache_key(measured) and json.loads(stored.read_text())["cosine_mean"] == first.cosine_mean
    assert verdict_for(bundle, B.ROLE_ENCODER) == first  # read back: a re-measurement differs in query_ms
    assert verdict_for(bundle, B.ROLE_ENCODER, cached=False).query_ms != first.query_ms


def test_a_bundle_sharing_the_encoder_file_has_a_verdict_of_its_own(share_bundle: B.Bundle, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Verdicts were cached by the encoder file's sha256 alone: a bundle that judges the same int8 file by fp32's
    thresholds failed it and stored that FAIL under the shared key, so every bundle with that encoder switched to its
    fp32 twin (whose store then refused to open: "indexed with another encoder"). Each keeps its own verdict now."""
    monkeypatch.setenv("EDGE_RAG_HOME", str(tmp_path))
    first = verdict_for(share_bundle, B.ROLE_ENCODER)
    stricter = B.Bundle.load(linked_bundle(share_bundle, tmp_path / "fp32", {}, precision="fp32"))
    other = verdict_for(stricter, B.ROLE_ENCODER)
    assert other.precision == "fp32" and not other.passed, other.summary()
    assert verdict_for(share_bundle, B.ROLE_ENCODER) == first and first.passed
    assert select_encoder(share_bundle) == share_bundle.require(B.ROLE_ENCODER)


@pytest.fixture(scope="module")
def cached(share_bundle: B.Bundle, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Verdict]:
    """(name, verdict) of the cache file a first verification of the bundle's encoder writes, measured once."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGE_RAG_HOME", str(home))
        first = verdict_for(share_bundle, B.ROLE_ENCODER)
    [stored] = (home / "verify").glob("*.json")
    return stored.name, first


@pytest.mark.parametrize("damage", [
    lambda v: {**v, "precision": "int4"},  # no thresholds for it: its summary() raised KeyError
    lambda v: {**v, "passed": "no"},  # a str is truthy: a failing verdict read as passing
    lambda v: {**v, "cosine_mean": None},
    lambda v: [v],
    lambda v: {k: x for k, x in v.items() if k != "cpu"},
])
def test_a_damaged_cached_verdict_is_measured_again(share_bundle: B.Bundle, cached: tuple[str, Verdict],
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage) -> None:
    """Issue #43: a cached verdict of the wrong shape was taken as it was (or raised later); it is measured again.
    Each case damages a copy of the one file a first verification wrote."""
    bundle = share_bundle
    monkeypatch.setenv("EDGE_RAG_HOME", str(tmp_path))
    name, first = cached
    stored = tmp_path / "verify" / name
    stored.parent.mkdir()
    stored.write_text(json.dumps(damage(asdict(first))))
    again = verdict_for(bundle, B.ROLE_ENCODER)
    assert again.passed is True and again.precision == first.precision and again.query_ms != first.query_ms
    assert json.loads(stored.read_text())["query_ms"] == again.query_ms and again.summary()


def per_tensor_int8(bundle: B.Bundle) -> Path:
    """The bundle's fp32 encoder quantised to per-tensor int8, kept in tests/.cache keyed by the fp32 file's sha256
    and onnxruntime's version (what it is made from; quantize_dynamic costs ~5 s of CPU)."""
    done = WEAK / f"{bundle.sha256(B.ROLE_ENCODER_FP32)[:16]}-{onnxruntime.__version__}.onnx"
    if not done.is_file():
        WEAK.mkdir(parents=True, exist_ok=True)
        tmp = WEAK / f".{os.getpid()}-{done.name}"
        quantize_dynamic(str(bundle.require(B.ROLE_ENCODER_FP32)), str(tmp), weight_type=QuantType.QInt8,
                         per_channel=False)
        os.replace(tmp, done)  # another file's process may land the same one first: same inputs, same model
    return done


@pytest.fixture(scope="module")
def weak_bundle(bundle: B.Bundle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real bundle with its int8 encoder swapped for per-tensor int8 (a real, measurably worse
    quantisation) and its reference set cut to ``reference_share``, on which that encoder fails as on all 64
    sentences (test_the_emulated_share_still_fails_a_per_tensor_int8_encoder) and the fp32 twin passes; the other
    files are linked, not copied."""
    out = tmp_path_factory.mktemp("weak")
    share = reference_share(bundle, out / "reference.npz")
    return linked_bundle(bundle, out / "b", {B.ROLE_ENCODER: per_tensor_int8(bundle), B.ROLE_REFERENCE: share})


def test_failing_int8_falls_back_to_fp32_and_says_so(weak_bundle: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("EDGE_RAG_HOME", str(tmp_path))
    bundle = B.Bundle.load(weak_bundle)
    with pytest.warns(RuntimeWarning, match=r"int8 encoder on .*cosine mean 0\.\d+ .*FAIL.*using the bundle's fp32"):
        assert select_encoder(bundle) == bundle.require(B.ROLE_ENCODER_FP32)
    assert main(["models", "verify", "--bundle", str(weak_bundle)]) == 0
    out = capsys.readouterr().out
    assert "int8 encoder" in out and ": FAIL" in out and "fp32 encoder" in out and ": PASS" in out
    assert "runtime uses the fp32 encoder" in out


def test_the_memory_plan_prices_the_fp32_encoder_it_falls_back_to(weak_bundle: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan priced the encoder sessions by the bundle's int8 file (23 MB) when the fp32 twin (90 MB) was loaded,
    ~4× the weights in each session: here int8 fails verification, and the question encoder's part and the server's
    indexing encoder's part are those of the fp32 file EdgeRAG runs."""
    monkeypatch.setenv("EDGE_RAG_HOME", str(tmp_path / "home"))
    bundle = B.Bundle.load(weak_bundle)
    fp32, router = bundle.require(B.ROLE_ENCODER_FP32), bundle.require(B.ROLE_ROUTER)
    dim, seq = int(bundle.encoder["dim"]), int(bundle.encoder["max_seq_len"])
    with pytest.warns(RuntimeWarning, match="using the bundle's fp32"), \
            EdgeRAG(tmp_path / "db", bundle=weak_bundle, config=Config(index_threads=1)) as rag:
        batch, heads, ffn = rag.plan.encode_batch_tokens, int(bundle.encoder.get("heads", ENCODER_HEADS)), bundle.encoder.get("ffn")
        session = encoder_estimate(fp32.stat().st_size + router.stat().st_size, dim, batch, seq, heads, ffn)
        indexing = encoder_estimate(fp32.stat().st_size, dim, batch, seq, heads, ffn)
        assert rag.plan.component("encoder").parts == session.parts
        assert rag.plan.component("indexing encoder").parts == indexing.parts


def test_failing_int8_without_fp32_exits_non_zero(weak_bundle: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    from convert.bundle import assemble

    bundle = B.Bundle.load(weak_bundle)
    (tmp_path / M.GENERATOR_ROLE.file).symlink_to(bundle.require(B.ROLE_GENERATOR).resolve())
    files = {f["role"]: bundle.root / f["name"] for f in bundle.files() if f["role"] != B.ROLE_ENCODER_FP32}
    assemble(tmp_path, files | {B.ROLE_GENERATOR: tmp_path / M.GENERATOR_ROLE.file}, "gemma", bundle.encoder,
             M.PROFILES["gemma"])
    assert main(["models", "verify", "--bundle", str(tmp_path), "--full"]) == 1
    out = capsys.readouterr().out
    assert "all re-hashed" in out and ": FAIL" in out and "fp32 encoder" not in out


def test_the_emulated_share_still_fails_a_per_tensor_int8_encoder(bundle: B.Bundle, weak_bundle: Path,
                                                                   tmp_path: Path) -> None:
    """The emulated checks (below; test_aarch64's install) gate the int8 encoder on a share of the reference set
    (``reference_share``): on that share the int8 gate must still fail the per-tensor encoder it fails on all 64
    sentences, or a pass under emulation would prove nothing."""
    share = reference_share(bundle, tmp_path / "reference.npz")
    weak = B.Bundle.load(weak_bundle)
    verdict = verify_encoder(weak.require(B.ROLE_ENCODER), weak.require(B.ROLE_TOKENIZER), share, "int8",
                             int(weak.encoder["max_seq_len"]), threads=1, repeats=1)
    assert verdict.sentences == EMULATED_SHARE and not verdict.passed, verdict.summary()


# The check `models verify` makes, in an emulated process: the bundle's hashes are checked natively above, and one
# timed query (emulated time says nothing about a device; `models verify`'s 20 cost 28 s of CPU under qemu here).
EMULATED_VERIFY = """
import json, sys
from dataclasses import asdict
from edge_rag.models import bundle as B
from edge_rag.models.verify import verify_encoder
bundle = B.Bundle.load(sys.argv[1], verify=False)
verdict = verify_encoder(bundle.require(B.ROLE_ENCODER), bundle.require(B.ROLE_TOKENIZER), sys.argv[2],
                         bundle.encoder["precision"], int(bundle.encoder["max_seq_len"]), threads=1, repeats=1)
print(json.dumps(asdict(verdict)))
"""


def test_verify_under_an_emulated_avx2_only_cpu(bundle: B.Bundle, tmp_path: Path) -> None:
    """The AVX2-only kernel path (no AVX-512/VNNI) on every run: qemu-user emulates a Haswell CPU, where the bundle's
    int8 encoder re-embeds a share of the reference sentences (``reference_share``) and must pass the int8
    thresholds."""
    share = reference_share(bundle, tmp_path / "reference.npz")
    verdict = Verdict(**on_emulated_haswell(EMULATED_VERIFY, [str(bundle.root), str(share)],
                                            env={"EDGE_RAG_HOME": str(tmp_path)}))
    assert verdict.cpu == "x86_64 AVX2" and verdict.precision == "int8", verdict
    assert verdict.sentences == len(load_reference(share)[0]) == EMULATED_SHARE, verdict
    assert verdict.passed, verdict.summary()


@pytest.mark.parametrize("arrays", [
    None,  # not an .npz at all
    {"texts": np.array(["a", "b"])},  # no vectors
    {"texts": np.array(["a", "b"]), "vectors": np.zeros((3, 384), np.float32)},  # three vectors for two sentences
    {"texts": np.array(["a", "b"]), "vectors": np.zeros((2, 100), np.float32)},  # another width than the encoder's
])
def test_a_damaged_reference_set_is_a_bundle_error(bundle: B.Bundle, tmp_path: Path, arrays) -> None:
    """It was a raw traceback (KeyError, a broadcast ValueError) from `models verify` and from the first open."""
    reference = tmp_path / "reference.npz"
    if arrays is None:
        reference.write_bytes(b"not a numpy archive")
    else:
        np.savez(reference, **arrays)
    with pytest.raises(BundleError, match="reference set"):
        verify_encoder(bundle.require(B.ROLE_ENCODER), bundle.require(B.ROLE_TOKENIZER), reference, "int8")
