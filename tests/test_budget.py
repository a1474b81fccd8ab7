"""Memory budget: the GGUF header reader, plan() on the real bundle, and a real run inside a planned budget."""
from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from edge_rag import memory, pipeline
from edge_rag.config import Config, Tier
from edge_rag.decision.certified import CertifiedPath
from edge_rag.documents.chunk import chunk, read_documents
from edge_rag.documents.files import iter_files
from edge_rag.errors import MAX_QUESTION_CHARS, BudgetError, BundleError
from edge_rag.memory import MIN_N_CTX, RUNTIME_BASE_MB, plan, read_gguf
from edge_rag.memory.estimate import ENCODER_HEADS, encoder_estimate
from edge_rag.models import bundle as B
from edge_rag.pipeline import EdgeRAG
from edge_rag.reading.reader import reader_file
from edge_rag.storage.cache import MAX_ANSWER_BYTES, AnswerCache
from edge_rag.types import Answer, Document, Route

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DOCS = ROOT / "edge_rag" / "sample" / "docs"


@pytest.fixture(scope="module")
def gguf(bundle: B.Bundle) -> Path:
    return bundle.require(B.ROLE_GENERATOR)


@pytest.fixture(scope="module")
def sample_passages() -> int:
    c = Config()
    docs = [d for p in iter_files([SAMPLE_DOCS]) for d in read_documents(p)]
    return sum(len(chunk(d, c.passage_mode, c.min_sentence_chars)) for d in docs)


@pytest.fixture
def pinned_base(monkeypatch) -> float:
    """The runtime base every EdgeRAG of the test plans with, measured once. The tests below price a budget a few MB
    around a plan; this process's RSS moves by more than that between two measurements (an EdgeRAG closed, glibc
    giving its memory back), and a budget meant to shrink the batch did not (2048 tokens still fitted)."""
    base = memory.runtime_base_estimate()
    monkeypatch.setattr(pipeline, "runtime_base_estimate", lambda: base)
    return base.mb


def fixed_plan(bundle: B.Bundle, config: Config, passages: int = 0) -> memory.Plan:
    """plan() with the calibrated runtime base, so results do not depend on what this test process holds."""
    return plan(bundle, config, passages, base_mb=RUNTIME_BASE_MB)


# -- GGUF header -------------------------------------------------------------------------------
RSS_PROBE = """
import json, numpy as np
from edge_rag import memory
before = memory.rss_mb()
block = np.ones(64 * 2**20, dtype=np.uint8)  # 64 MB, every page written
during = memory.rss_mb()
del block
print(json.dumps([before, during, memory.rss_mb(), memory.peak_rss_mb()]))
"""


def test_rss_probe_sees_an_allocation() -> None:
    """In a fresh process (no freed pages to reuse): touching 64 MB raises RSS by about that much, freeing
    it lowers RSS again, and the high-water mark keeps the top."""
    out = subprocess.run([sys.executable, "-c", RSS_PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    before, during, after, peak = json.loads(out.stdout)
    assert 56 < during - before < 80, (before, during)
    assert during - after > 48 and peak >= during - 1, (during, after, peak)


def test_read_gguf_on_the_real_generator(gguf: Path) -> None:
    start = time.perf_counter()
    info = read_gguf(gguf)
    assert time.perf_counter() - start < 2.0  # 262k vocab strings skipped, no weights read
    assert (info.arch, info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == ("gemma3", 18, 640, 4, 1)
    assert (info.key_length, info.value_length, info.n_ff) == (256, 256, 2048)
    assert info.n_vocab == 262144 and info.context_length == 32768
    assert info.file_bytes == gguf.stat().st_size
    assert 0.9 * info.file_bytes < info.tensor_bytes < info.file_bytes
    assert info.metadata["general.architecture"] == "gemma3"


def _copy_header(src: Path, dst: Path, nbytes: int) -> None:
    with open(src, "rb") as f:
        dst.write_bytes(f.read(nbytes))


@pytest.mark.parametrize("cut", [0, 3, 20, 4096, 1 << 20])
def test_truncated_gguf_header_is_a_bundle_error(gguf: Path, tmp_path: Path, cut: int) -> None:
    bad = tmp_path / "cut.gguf"
    _copy_header(gguf, bad, cut)
    with pytest.raises(BundleError, match="cut.gguf"):
        read_gguf(bad)


def test_gguf_missing_its_last_byte_is_a_bundle_error(gguf: Path, tmp_path: Path) -> None:
    """Header intact, tensor data one byte short (a sparse copy: no 250 MB write)."""
    bad = tmp_path / "short.gguf"
    _copy_header(gguf, bad, 8 << 20)
    size = gguf.stat().st_size
    with open(bad, "r+b") as f:
        f.truncate(size)
    read_gguf(bad)  # full length: fine
    with open(bad, "r+b") as f:
        f.truncate(size - 1)
    with pytest.raises(BundleError, match="truncated"):
        read_gguf(bad)


def test_a_gguf_header_is_read_once_per_file_version(gguf: Path, tmp_path: Path) -> None:
    """Every EdgeRAG open plans memory from the header (~0.3 s to skip gemma's vocabulary): read once per process
    while the file stays as it was; an edit that keeps its size and restores its mtime is read again."""
    assert read_gguf(gguf) is read_gguf(gguf)
    copy = tmp_path / "copy.gguf"
    _copy_header(gguf, copy, 8 << 20)
    with open(copy, "r+b") as f:
        f.truncate(gguf.stat().st_size)
    first = read_gguf(copy)
    assert read_gguf(copy) is first
    times = copy.stat()
    with open(copy, "r+b") as f:
        f.write(b"GGML")
    os.utime(copy, ns=(times.st_atime_ns, times.st_mtime_ns))
    with pytest.raises(BundleError, match="bad magic"):
        read_gguf(copy)


def _kv(key: str, vtype: int, value: bytes) -> bytes:
    """One GGUF metadata entry: length-prefixed key, value type, value."""
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + value


ARCH = _kv("general.architecture", 8, struct.pack("<Q", 6) + b"gemma3")
SIZES = b"".join(_kv(f"gemma3.{key}", 4, struct.pack("<I", n))
                for key, n in (("vocab_size", 256), ("embedding_length", 640), ("attention.head_count", 4)))


@pytest.mark.parametrize("payload, why", [
    # a negative block count planned the model into any budget (1 MB), an array was a TypeError, alignment 0 a
    # ZeroDivisionError, 4 billion dimensions a 4 GB format string
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 5) + ARCH + SIZES + _kv("gemma3.block_count", 5, struct.pack("<i", -5)),
     "not a count"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 5) + ARCH + SIZES
     + _kv("gemma3.block_count", 9, struct.pack("<IQ", 4, 2000) + b"\1\0\0\0" * 2000), "not a count"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _kv("general.alignment", 4, struct.pack("<I", 0)), "alignment"),
    (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"t" + struct.pack("<I", 0xFFFFFFF0), "dimensions"),
])
def test_a_gguf_header_with_impossible_values_is_a_bundle_error(tmp_path: Path, payload: bytes, why: str) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(payload + b"\0" * (-len(payload) % 32))  # up to the (default) alignment: not a truncated file
    with pytest.raises(BundleError, match=why):
        read_gguf(bad)


@pytest.mark.parametrize("payload", [
    b"GGML" + b"\0" * 64,  # wrong magic
    b"GGUF" + struct.pack("<I", 99) + b"\0" * 64,  # unknown version
    b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 40),  # key longer than the file
    b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 77),  # bad type
    b"GGUF" + struct.pack("<IQQ", 3, 0, 0),  # no architecture
])
def test_corrupt_gguf_is_a_bundle_error(tmp_path: Path, payload: bytes) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(payload)
    with pytest.raises(BundleError):
        read_gguf(bad)


# -- plan --------------------------------------------------------------------------------------
def test_plan_is_cheap_and_within_budget(bundle: B.Bundle, sample_passages: int) -> None:
    start = time.perf_counter()
    plan(bundle, Config(), sample_passages)
    assert time.perf_counter() - start < 2.0
    p = fixed_plan(bundle, Config(), sample_passages)
    assert p.total_mb <= Config().memory_budget_mb
    assert {c.name for c in p.components} == {"runtime base", "encoder", "reader", "index", "generator", "answer cache"}
    assert (p.n_ctx, p.encode_batch_tokens) == (Config().n_ctx, Config().encode_batch_tokens)
    assert "generator" in str(p) and p.apply(Config()).n_ctx == p.n_ctx


def test_plan_counts_the_neural_reader_only_where_it_runs(bundle: B.Bundle) -> None:
    """The certified path loads reader.onnx (its own weights and batch activations): planned, else not (the rule
    reader; and always GPT, cgr=False, which reads nothing)."""
    big = Config(memory_budget_mb=100_000)
    names = {r: {c.name for c in fixed_plan(bundle, big.with_(certified=True, reader=r)).components}
             for r in ("neural", "rules")}
    assert "reader" in names["neural"] and "reader" not in names["rules"]
    assert "reader" not in {c.name for c in fixed_plan(bundle, big.with_(cgr=False)).components}
    p = fixed_plan(bundle, big.with_(certified=True))
    reader, encoder = p.component("reader"), p.component("encoder")
    assert reader.parts["weights"] > reader_file(bundle).stat().st_size / 2**20  # at least the file itself
    assert reader.parts["activations"] == pytest.approx(encoder.parts["activations"], rel=0.5)  # same shape
    assert p.total_mb > fixed_plan(bundle, big.with_(certified=False)).total_mb


def test_plan_grows_with_n_ctx_and_passages(bundle: B.Bundle) -> None:
    big = Config(memory_budget_mb=100_000)
    totals = [fixed_plan(bundle, big.with_(n_ctx=n)).total_mb for n in (1024, 2048, 4096, 8192)]
    assert totals == sorted(totals) and totals[-1] - totals[0] > 100  # KV cache alone: 18 MB per 1k
    kv = [fixed_plan(bundle, big.with_(n_ctx=n)).component("generator").parts["KV cache"] for n in (1024, 2048)]
    assert kv[1] == pytest.approx(2 * kv[0]) and kv[0] == pytest.approx(18.0)  # 18 layers × 1 × 512 × 2 B
    by_passages = [fixed_plan(bundle, big, n).component("index").mb for n in (0, 10_000, 1_000_000)]
    assert by_passages == sorted(by_passages) and by_passages[2] > 1000


def test_plan_prices_the_indexing_encoder_of_a_server_with_writes(bundle: B.Bundle) -> None:
    """`edge-rag serve` with writes indexes in a second encoder session (Config.index_threads): the plan holds it as
    its own part, encoder_estimate of the encoder model at the plan's batch, and picks the batch that fits it too;
    plain use plans none. A budget that holds the plain plan but not the second session names it."""
    big = Config(memory_budget_mb=100_000)
    seq = min(big.max_seq_len, int(bundle.encoder.get("max_seq_len", big.max_seq_len)))

    def session(batch: int) -> dict[str, float]:
        return encoder_estimate(bundle.require(B.ROLE_ENCODER).stat().st_size, int(bundle.encoder["dim"]), batch, seq,
                                int(bundle.encoder.get("heads", ENCODER_HEADS)), bundle.encoder.get("ffn")).parts

    plain, server = fixed_plan(bundle, big), fixed_plan(bundle, big.with_(index_threads=1))
    assert "indexing encoder" not in {c.name for c in plain.components}
    assert server.encode_batch_tokens == plain.encode_batch_tokens == big.encode_batch_tokens
    assert server.component("indexing encoder").parts == session(server.encode_batch_tokens)
    assert server.total_mb == pytest.approx(plain.total_mb + server.component("indexing encoder").mb)
    assert "indexing encoder" in str(server)
    at_512 = fixed_plan(bundle, big.with_(index_threads=1, encode_batch_tokens=512))
    fitted = fixed_plan(bundle, big.with_(index_threads=1, memory_budget_mb=math.ceil(at_512.total_mb)))
    assert fitted.encode_batch_tokens == 512 and fitted.component("indexing encoder").parts == session(512)
    smallest = {t: fixed_plan(bundle, big.with_(index_threads=t, n_ctx=MIN_N_CTX, encode_batch_tokens=256))
                for t in (0, 1)}
    between = Config(memory_budget_mb=math.floor((smallest[0].total_mb + smallest[1].total_mb) / 2))
    assert fixed_plan(bundle, between).total_mb <= between.memory_budget_mb
    with pytest.raises(BudgetError) as err:
        fixed_plan(bundle, between.with_(index_threads=1))
    msg = str(err.value)
    assert msg.startswith("indexing encoder needs ~") and f"of the {between.memory_budget_mb} MB budget" in msg
    assert "at encode_batch_tokens 256" in msg and f"at least {int(smallest[1].total_mb) + 1}" in msg


def test_impossible_budget_names_the_component_and_numbers(bundle: B.Bundle) -> None:
    with pytest.raises(BudgetError) as err:
        fixed_plan(bundle, Config(memory_budget_mb=150))
    msg = str(err.value)
    assert msg.startswith("generator needs ~") and "of the 150 MB budget remain after runtime base 75" in msg
    assert "KV cache" in msg and f"n_ctx {MIN_N_CTX}" in msg
    assert "raise memory_budget_mb (--memory-mb) to at least" in msg
    with pytest.raises(BudgetError, match=r"^runtime base needs ~75 MB"):
        fixed_plan(bundle, Config(memory_budget_mb=50))


def test_a_budget_refused_on_the_command_line_names_its_option(bundle_dir: Path, tmp_path: Path, capsys) -> None:
    """`edge-rag ask … --memory-mb 300` (docs/guides/devices.md) said only "raise memory_budget_mb to at least 338":
    a Config field the command line has no option of that name for. The line names --memory-mb."""
    from edge_rag.cli.commands import main

    assert main(["ask", "hi", "--db", str(tmp_path / "db"), "--bundle", str(bundle_dir), "--memory-mb", "300"]) == 2
    line = capsys.readouterr().err.strip()
    least = re.search(r"raise memory_budget_mb \(--memory-mb\) to at least (\d+)$", line)
    assert line.startswith("edge-rag: error: ") and least and int(least[1]) > 300, line


def test_the_plan_holds_the_answer_cache_full(bundle: B.Bundle) -> None:
    """The answer cache was outside the plan: Config(cache_size=10**6) in a 345 MB budget (a plan of 339) peaked at
    464 MB after 5,000 questions of 45 KB answers, and grew on. The plan prices cache_size answers of the largest
    size the cache keeps, under the longest questions: a cache full of them holds no more; one too large is refused."""
    config = Config(cache_size=32)
    priced = fixed_plan(bundle, config, 100).component("answer cache").mb
    cache = AnswerCache(config)
    tracemalloc.start()
    try:
        for i in range(2 * config.cache_size):
            question = f"{i} " + "\U0001F600" * (MAX_QUESTION_CHARS - 8)  # 4 bytes a character, 12 in JSON
            answer = Answer(question=question, answer="a", route=Route.RAG, tier=Tier.EASY)
            room = MAX_ANSWER_BYTES - len(json.dumps(answer.to_dict()))
            cache.put(question, Answer(question=question, answer="a", route=Route.RAG, tier=Tier.EASY,
                                       context="x" * room), "f" * 32 + ":100000:" + "0" * 12)
        del question, answer
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(cache) == config.cache_size and held / memory.rss.MB <= priced
    fits = fixed_plan(bundle, config.with_(cache_size=0), 100).total_mb
    with pytest.raises(BudgetError, match=r"^answer cache needs"):
        fixed_plan(bundle, config.with_(cache_size=10**5, memory_budget_mb=int(fits) + 100), 100)


def test_tight_budget_shrinks_n_ctx_then_the_encoder_batch(bundle: B.Bundle) -> None:
    wide = Config(n_ctx=8192)
    at_2048 = fixed_plan(bundle, wide.with_(n_ctx=2048, memory_budget_mb=100_000))
    p = fixed_plan(bundle, wide.with_(memory_budget_mb=math.ceil(at_2048.total_mb)))
    assert (p.n_ctx, p.encode_batch_tokens) == (2048, wide.encode_batch_tokens)
    smallest = fixed_plan(bundle, wide.with_(n_ctx=MIN_N_CTX, encode_batch_tokens=256, memory_budget_mb=100_000))
    p = fixed_plan(bundle, wide.with_(memory_budget_mb=math.ceil(smallest.total_mb)))
    assert (p.n_ctx, p.encode_batch_tokens) == (MIN_N_CTX, 256)
    with pytest.raises(BudgetError):
        fixed_plan(bundle, wide.with_(memory_budget_mb=math.floor(smallest.total_mb)))


def test_a_larger_store_is_planned_as_plan_would_plan_it(bundle: B.Bundle) -> None:
    """A larger index leaves less of the budget to the encoder batch: ``with_passages`` accepts exactly the stores
    ``plan`` accepts, at the batch ``plan`` would choose for them (it kept the batch it had and refused a store that
    fits at a smaller one: 3,000 sentences in 800 MB were refused although 1,024 tokens fit them in 536), and refuses
    the rest with the smallest plan's numbers."""
    dim, big = int(bundle.encoder["dim"]), Config(memory_budget_mb=100_000)
    tight = big.with_(memory_budget_mb=math.ceil(fixed_plan(bundle, big).total_mb))
    start = fixed_plan(bundle, tight)
    assert start.encode_batch_tokens == tight.encode_batch_tokens  # the budget holds the largest batch, just
    lo, hi = 0, 1 << 24  # the largest store plan() accepts in this budget
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            fixed_plan(bundle, tight, mid)
            lo = mid
        except BudgetError:
            hi = mid - 1
    for n in (3000, lo // 2, lo):
        grown, fresh = start.with_passages(n, tight, dim), fixed_plan(bundle, tight, n)
        assert (grown.encode_batch_tokens, grown.n_ctx, grown.components) == (
            fresh.encode_batch_tokens, fresh.n_ctx, fresh.components), n
        assert grown.total_mb <= tight.memory_budget_mb
    assert start.with_passages(3000, tight, dim).encode_batch_tokens < start.encode_batch_tokens
    with pytest.raises(BudgetError) as err:
        start.with_passages(lo + 1, tight, dim)
    smallest = fixed_plan(bundle, big.with_(encode_batch_tokens=1), lo + 1)
    assert f"for {lo + 1} passages" in str(err.value)
    assert str(err.value).endswith(f"raise memory_budget_mb (--memory-mb) to at least {int(smallest.total_mb) + 1}")


def test_indexing_runs_the_sessions_at_the_batch_the_grown_plan_holds(bundle: B.Bundle, bundle_dir: Path,
                                                                      tmp_path: Path, pinned_base: float) -> None:
    """A budget that holds the largest encoder batch for an empty store, not for 4,000 passages more: adding them
    re-plans to a smaller batch and every session (the question encoder, the loaded reader) runs at it, so what runs
    is what the plan priced (the add was refused, naming a budget that was enough)."""
    config = Config()
    opened = plan(bundle, config.with_(memory_budget_mb=100_000), generator=False, base_mb=pinned_base)
    config = config.with_(memory_budget_mb=math.ceil(opened.total_mb) + 8)  # room for this process's RSS to move
    docs = [f"Sentence number {i} describes a topic of its own in several plain words." for i in range(4000)]
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=config) as rag:
        assert rag.plan.encode_batch_tokens == config.encode_batch_tokens and config.reads_neural
        rag.warm_up()  # the reader is loaded at the batch of the plan it opened with
        assert rag.add_documents(docs) == len(docs)
        batch = rag.plan.encode_batch_tokens
        assert batch < config.encode_batch_tokens and rag.plan.total_mb <= config.memory_budget_mb
        assert rag.config.encode_batch_tokens == rag.certified.config.encode_batch_tokens == batch
        assert rag.encoder.batch_tokens == rag.certified.neural_reader().reader.batch_tokens == batch


def test_a_calibration_applied_while_the_plan_grows_is_kept_at_the_grown_batch(bundle: B.Bundle, bundle_dir: Path,
                                                                               tmp_path: Path, pinned_base: float, monkeypatch) -> None:
    """A calibration applied (use_calibration, the server's /admin apply) while indexing grew the plan: the grown plan
    re-installed the path it had read before the swap (the new certificate lost: 0.4 decided, 0.1 applied), or the
    swap, made before the growth, put back the old plan's batch (2048 tokens where the plan holds 1024). The window
    is held open with events: indexing inside CertifiedPath.planned, then applying inside CertifiedPath.swapped."""
    config = Config()
    opened = plan(bundle, config.with_(memory_budget_mb=100_000), generator=False, base_mb=pinned_base)
    config = config.with_(memory_budget_mb=math.ceil(opened.total_mb) + 4)  # 1,600 passages need a smaller batch
    docs = [f"Sentence number {i} describes a topic of its own in several plain words." for i in range(1600)]
    planned, swapped = CertifiedPath.planned, CertifiedPath.swapped

    def check(rag: EdgeRAG, alpha: float) -> None:
        assert rag.plan.encode_batch_tokens < config.encode_batch_tokens
        assert rag.certified.config.max_error_rate == rag.config.max_error_rate == alpha
        assert rag.config.encode_batch_tokens == rag.certified.config.encode_batch_tokens == rag.plan.encode_batch_tokens

    with EdgeRAG(tmp_path / "a", bundle=bundle_dir, config=config) as rag:
        lock, applying, applied = getattr(rag, "plan_lock", threading.Lock()), None, threading.Event()

        class Told:  # the plan lock, telling when the applying thread waits for it
            def __enter__(self) -> None:
                if threading.current_thread() is applying:
                    applied.set()
                lock.acquire()

            def __exit__(self, *exc: object) -> None:
                lock.release()

        def apply() -> None:
            rag.use_calibration(rag.certified.shipped, 0.1)
            applied.set()

        def growing(path: CertifiedPath, config: Config) -> CertifiedPath:
            nonlocal applying
            if applying is None:  # the first growth
                applying = threading.Thread(target=apply)
                applying.start()
                applied.wait(10)  # applied, or waiting for the lock the growth holds
            return planned(path, config)

        monkeypatch.setattr(rag, "plan_lock", Told(), raising=False)
        monkeypatch.setattr(CertifiedPath, "planned", growing)
        rag.add_documents(docs)
        assert applying is not None
        applying.join()
        check(rag, 0.1)
    monkeypatch.setattr(CertifiedPath, "planned", planned)

    with EdgeRAG(tmp_path / "b", bundle=bundle_dir, config=config) as rag:
        made, grown = threading.Event(), threading.Event()

        def late(path: CertifiedPath, *args: object) -> CertifiedPath:
            new = swapped(path, *args)  # type: ignore[arg-type]
            made.set()
            grown.wait(10)
            return new

        monkeypatch.setattr(CertifiedPath, "swapped", late)
        applying = threading.Thread(target=rag.use_calibration, args=(rag.certified.shipped, 0.2))
        applying.start()
        made.wait(10)
        rag.add_documents(docs)
        grown.set()
        applying.join()
        check(rag, 0.2)

def test_a_store_grown_by_another_process_is_loaded_only_if_the_plan_holds_it(bundle: B.Bundle, bundle_dir: Path,
                                                                               tmp_path: Path, pinned_base: float) -> None:
    """A reader follows commits of other processes (`edge-rag index` beside a server): the index it loads is re-planned
    first, like its own additions. A commit the plan holds is loaded (the plan counts it); one it holds at no batch
    fails the question with a BudgetError and stays unloaded (it was loaded whatever its size, past the budget)."""
    from edge_rag.storage.store import Part, Store
    from edge_rag.types import Document

    config = Config(encode_batch_tokens=256)  # the smallest batch already: growth has nothing to shrink
    opened = plan(bundle, config.with_(memory_budget_mb=100_000), generator=False, base_mb=pinned_base)
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir,
                 config=config.with_(memory_budget_mb=math.ceil(opened.total_mb) + 20)) as rag:
        dim, room = rag.encoder.dim, rag.plan.room(0, rag.config, rag.encoder.dim)
        other = Store(tmp_path / "db", dim, rag.store.encoder_id)  # the other process's store
        vectors = np.random.default_rng(0).standard_normal((room + 1, dim)).astype(np.float32)

        def commit(doc: str, n: int, at: int) -> None:
            other.add([Part(Document(doc, doc, "x"), 0, [f"{doc} {i}" for i in range(n)], last=True)], vectors[at:at + n])

        commit("a", room // 2, 0)
        rag.ask("Who founded the museum?")
        assert rag.plan.passages == rag.store.index.get_current_count() == room // 2
        commit("b", room + 1 - room // 2, room // 2)
        with pytest.raises(BudgetError, match=f"grew to {room + 1} passages") as err:
            rag.ask("Who founded the museum?")
        assert "raise memory_budget_mb (--memory-mb) to at least" in str(err.value)
        assert rag.store.index.get_current_count() == rag.plan.passages == room // 2
        other.close()


def test_stored_passages(tmp_path: Path) -> None:
    from edge_rag.storage.store import Part, Store
    from edge_rag.types import Document

    assert memory.stored_passages(tmp_path / "none") == 0
    store = Store(tmp_path, 4)
    vectors = np.eye(4, dtype=np.float32)[:3]
    store.add([Part(Document("d", "t", "x"), 0, ["a", "b", "c"], last=True)], vectors)
    store.close()
    assert memory.stored_passages(tmp_path) == 3


# -- a real run inside the planned budget -------------------------------------------------------
def test_real_run_stays_inside_the_planned_budget(bundle: B.Bundle, bundle_dir: Path, sample_passages: int) -> None:
    """Budget = the plan at n_ctx 1024 (+10 MB slack); config asks for 2048. The seeds' decision, which generates,
    in the worst order: llama.cpp loaded before indexing, then the 20 answerable sample questions at temperature 0 and 3 HARD-tier
    generations. Invariants, whatever this machine's RSS: peak RSS ≤ plan ≤ budget, and the plan keeps
    2048 exactly when 2048 fits by its own estimate at the encoder batch it chose (with the runtime base
    the subprocess measured: where that base is higher, the batch shrinks before n_ctx does)."""
    at_1024 = fixed_plan(bundle, Config(memory_budget_mb=100_000, certified=False), sample_passages)
    budget_mb = math.ceil(at_1024.total_mb) + 10
    code = "import sys; from benchmarks.memory import main; main(sys.argv[1:])"
    args = ["--json", "--bundle", str(bundle_dir), "--budget", str(budget_mb), "--n-ctx", "2048",
            "--questions", "20", "--hard", "3", "--generator-first", "--seed-decision"]
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    p = result["plan"]
    assert result["questions"] == 20 and p["total_mb"] <= budget_mb
    assert result["peak_rss_mb"] <= budget_mb, result
    assert result["peak_rss_mb"] <= p["total_mb"], result
    # the encoder batch is chosen first (largest that fits), then n_ctx: compare at the batch it chose
    at_2048 = plan(bundle, Config(memory_budget_mb=100_000, n_ctx=2048, encode_batch_tokens=p["encode_batch_tokens"],
                                  certified=False), p["passages"], base_mb=p["runtime base"])
    assert (p["n_ctx"] == 2048) == (at_2048.total_mb <= budget_mb), (p, at_2048.total_mb)


ENCODE_LONG = """
import json, sys
import numpy as np
from edge_rag.memory import peak_rss_mb
from edge_rag.retrieval.encode import Encoder
encoder = Encoder(sys.argv[1], sys.argv[2], 256, 2048)
words = "alpha beta gamma delta harbour museum lighthouse river valley engine copper station garden".split()
texts = [" ".join(words[(i + j) % len(words)] for j in range(9000)) for i in range(256)]  # ~60k chars, one sentence
same = np.array_equal(encoder.encode(texts[:8]), encoder.encode([t[:3000] for t in texts[:8]]))  # 256 of ~450 tokens
before = peak_rss_mb()
encoder.encode(texts)
print(json.dumps({"rise": peak_rss_mb() - before, "same": bool(same)}))
"""


def test_encoding_long_passages_stays_within_the_planned_activations(bundle: B.Bundle) -> None:
    """A passage is cut to max_seq_len tokens, but the tokenizer kept the whole of each long text of a batch as overflow:
    1,024 passages of 60k characters (a file without sentence ends) held 1.8 GB during one indexing batch, in a
    budget of 340 MB. In a fresh process: encoding 256 of them raises peak RSS by no more than the plan prices the
    activations of that batch (it rose ~440 MB), and a long text keeps the vector of its first 3,000 characters."""
    path = bundle.require(B.ROLE_ENCODER)
    out = subprocess.run([sys.executable, "-c", ENCODE_LONG, str(path), str(bundle.require(B.ROLE_TOKENIZER))],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    priced = encoder_estimate(path.stat().st_size, int(bundle.encoder["dim"]), 2048, 256).parts["activations"]
    assert result["same"] and result["rise"] <= priced, (result, priced)


# -- EdgeRAG plans before it loads ----------------------------------------------------------------
REFUSE_SCRIPT = """
import json, math, sys
from edge_rag import BudgetError, Config, Document, EdgeRAG
from edge_rag.memory import peak_rss_mb, plan
from edge_rag.models.bundle import Bundle
from edge_rag.cli.commands import main

db, bundle, tight, room = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
out = {}
try:
    EdgeRAG(db, bundle=bundle, config=Config(memory_budget_mb=tight, certified=False))
except BudgetError as exc:
    out["error"] = str(exc)
out["peak_after_refusal"] = peak_rss_mb()
out["cli_exit"] = main(["ask", "When does the museum open?", "--db", db, "--bundle", bundle, "--memory-mb", str(tight),
                        "--seed-decision"])
# the models fit, priced from this process's own runtime base (the constant one is another CPU's): room MB to spare
fits = math.ceil(plan(Bundle.load(bundle), Config(memory_budget_mb=100_000, certified=False)).total_mb) + room
rag = EdgeRAG(db, bundle=bundle, config=Config(memory_budget_mb=fits, certified=False))
docs = [Document(f"d{i}", f"t{i}", f"Passage number {i} talks about a topic of its own.") for i in range(100000)]
try:
    rag.add_documents(docs)
except BudgetError as exc:
    out["index_error"] = str(exc)
out["stored"] = rag.store.count
print(json.dumps(out))
"""


def test_edgerag_refuses_an_impossible_budget_before_loading(bundle: B.Bundle, bundle_dir: Path,
                                                             tmp_path: Path) -> None:
    """In a fresh process, on the seeds' decision (which generates): a budget below the generator's needs raises
    BudgetError from EdgeRAG() (and exit 2 from the CLI) while peak RSS is still far below the models' sizes, so
    nothing large was loaded; a budget that fits the models but not 100k more passages, at any encoder batch,
    refuses the add before encoding any of them."""
    out = subprocess.run([sys.executable, "-c", REFUSE_SCRIPT, str(tmp_path / "db"), str(bundle_dir), "200", "20"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"].startswith("generator needs ~") and "of the 200 MB budget" in result["error"]
    assert result["peak_after_refusal"] < 150  # the GGUF alone is 241 MB, the encoder session ~50 MB
    assert result["cli_exit"] == 2 and "generator needs ~" in out.stderr
    assert result["index_error"].startswith("index needs ~") and "for 100000 passages" in result["index_error"]
    assert result["stored"] == 0


WORST_QUESTIONS = """
import json, re, sys, threading
from edge_rag import BudgetError, Config, EdgeRAG
from edge_rag.memory import peak_rss_mb, usage_mb
from edge_rag.reading.reader import MAX_WINDOWS, passage_context
db, bundle, question = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}
try:
    EdgeRAG(db, bundle=bundle, config=Config(memory_budget_mb=200))
except BudgetError as exc:
    out["refused"] = str(exc)
smallest = int(re.search(r"at least (\\d+)", out["refused"]).group(1))
try:
    EdgeRAG(db, bundle=bundle, config=Config(memory_budget_mb=smallest - 1))
except BudgetError:
    out["refused_below"] = True
rag = EdgeRAG(db, bundle=bundle, config=Config(memory_budget_mb=smallest))
rag.warm_up()
loaded = usage_mb()[0]  # the models and index in; only the questions' activations and answers to come
answers = []
def ask(n):  # a distinct question each time: the answer cache would answer a repeat unread
    answers.append(rag.ask(question[: len(question) - n]))
for n in range(4):  # each thread keeps its own malloc arena: a server's lanes and jobs thread ask on several
    worker = threading.Thread(target=ask, args=(n,))
    worker.start(), worker.join()
pair = [threading.Thread(target=ask, args=(n,)) for n in (4, 5)]
[t.start() for t in pair], [t.join() for t in pair]
hit = rag.store.passages([answers[0].passages[0].id])[0]
reader = rag.certified.neural_reader().reader
context = passage_context(hit.title, hit.text[:8192])[0]
running = sum(rag.plan.component(c).parts["activations"] for c in ("encoder", "reader"))  # what questions run
out.update(smallest=smallest, plan=rag.plan.total_mb, batch=rag.plan.encode_batch_tokens, peak=peak_rss_mb(),
           rise=peak_rss_mb() - loaded, running=running,
           titles=[a.passages[0].title for a in answers], read=[a.candidate is not None for a in answers],
           windows=len(reader.windows(question, context)), max_windows=MAX_WINDOWS)
print(json.dumps(out))
"""


def test_the_smallest_budget_admitted_holds_the_worst_questions(bundle_dir: Path, tmp_path: Path) -> None:
    """The plan prices the reader at a full batch of its longest windows, however little a typical question reads. In
    a fresh process, on the sample store plus one 16 KB record without a sentence end: a budget too small is refused
    at open, naming the smallest plan; a budget of that figure (the smallest it admits, at the smallest encoder batch)
    opens, and the longest question there is, finding that record, reads its READ_MAX_CHARS in MAX_WINDOWS windows on
    four threads one after another and two at once: the peak RSS within the plan, and its rise over the models loaded
    within the activations the plan prices for what questions run (the question encoder's and the reader's)."""
    from conftest import sample_store

    db = sample_store(bundle_dir, tmp_path / "db")
    words = "lighthouse keeper harbour copper museum engine valley station garden river bridge ferry bell".split()
    record = " ".join(words[(i * 7) % len(words)] for i in range(2400))[:16000]
    with EdgeRAG(db, bundle=bundle_dir) as rag:
        rag.add_documents([Document("longrecord", "Harbour record", record)])
    question = ("Which lighthouse keeper rang the harbour ferry bell by the copper museum engine? " * 30)
    question = question[:MAX_QUESTION_CHARS]
    out = subprocess.run([sys.executable, "-c", WORST_QUESTIONS, str(db), str(bundle_dir), question],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["refused_below"] and "raise memory_budget_mb (--memory-mb) to at least" in result["refused"], result
    assert result["batch"] == 256 and result["plan"] <= result["smallest"], result  # the smallest plan, admitted
    assert set(result["titles"]) == {"Harbour record"} and all(result["read"]), result  # the reader read it
    assert result["windows"] >= result["max_windows"], result  # its most windows, each full
    print(result)
    assert result["peak"] <= result["plan"] and result["rise"] <= result["running"], result


FIRST_RUN = """
import json, math, os, sys
from edge_rag import BudgetError, Config, EdgeRAG
from edge_rag.memory import peak_rss_mb, plan
from edge_rag.models.bundle import Bundle
db, bundle, first, second = sys.argv[1:5]
out = {}
os.environ["EDGE_RAG_HOME"] = first  # where the encoder's verdict is cached: none yet
tight = Config(memory_budget_mb=100_000, encode_batch_tokens=256)
smallest = plan(Bundle.load(bundle), tight, generator=False).total_mb  # priced from this process's own base
try:
    out["opened"] = EdgeRAG(db, bundle=bundle, config=Config(memory_budget_mb=math.ceil(smallest) + 10)).plan.total_mb
except BudgetError as exc:
    out["opened"] = str(exc)
out["verified"], out["peak"] = os.path.isdir(os.path.join(first, "verify")), peak_rss_mb()
os.environ["EDGE_RAG_HOME"] = second
try:
    EdgeRAG(db + "2", bundle=bundle, config=Config(memory_budget_mb=200))
except BudgetError as exc:
    out["error"] = str(exc)
out["verified_before_refusal"] = os.path.isdir(os.path.join(second, "verify"))
print(json.dumps(out))
"""


def test_a_first_run_verifying_its_encoder_is_planned_as_every_later_run(bundle_dir: Path, tmp_path: Path) -> None:
    """On a device with no encoder verdict cached yet (a first run, a new bundle), EdgeRAG verifies the encoder in
    this process. It did so before planning: the RSS glibc kept of that session counted as runtime base (129-167 MB,
    not 75), so a budget 10 MB over the smallest plan was refused on the first run ("raise memory_budget_mb to at least
    374") and met on the next; and a budget too small for anything loaded the encoder before it was refused (peak
    175 MB, 69 with the verdict cached). The base is measured and the budget checked first: the first run opens at the
    plan of every later run, and an impossible budget is refused before the encoder is verified."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    out = subprocess.run([sys.executable, "-c", FIRST_RUN, str(tmp_path / "db"), str(bundle_dir), str(first),
                          str(second)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert isinstance(result["opened"], float) and result["verified"], result  # verified here, and opened
    assert result["peak"] <= result["opened"], result
    assert "raise memory_budget_mb (--memory-mb) to at least" in result["error"], result
    assert not result["verified_before_refusal"], result


def test_the_certified_default_plans_no_generator_and_runs_where_it_would_not_fit(bundle: B.Bundle, bundle_dir: Path,
                                                                                  tmp_path: Path) -> None:
    """The shipped calibration certifies no generated answer at the default alpha, so the default never loads
    llama.cpp and its plan leaves it out: in a budget halfway between the smallest plan without the generator and the
    smallest with it (which the seeds' decision, generating, is refused), the default opens, indexes the sample and
    answers; asking it for the generator is a BudgetError, not an unplanned load. Halfway: this process's RSS, which
    the plans count as their runtime base, may move between the plans computed here and EdgeRAG's own."""
    tight = Config(memory_budget_mb=100_000, n_ctx=MIN_N_CTX, encode_batch_tokens=256)
    smallest = plan(bundle, tight.with_(certified=False))
    without = plan(bundle, tight, generator=False)
    assert smallest.generator and not without.generator
    budget = math.floor((smallest.total_mb + without.total_mb) / 2)
    with pytest.raises(BudgetError, match=r"generator (needs|\d+)"):
        EdgeRAG(tmp_path / "seeds", bundle=bundle_dir, config=Config(memory_budget_mb=budget, certified=False))
    with EdgeRAG(tmp_path / "default", bundle=bundle_dir, config=Config(memory_budget_mb=budget)) as rag:
        assert not rag.plan.generator and rag.plan.total_mb <= budget
        rag.add_files([SAMPLE_DOCS])
        answer = rag.ask("How much does an adult ticket cost?")
        assert answer.route.value == "RAG" and answer.answer == "£16", answer
        with pytest.raises(BudgetError, match="not in this EdgeRAG's memory plan"):
            _ = rag.generator
