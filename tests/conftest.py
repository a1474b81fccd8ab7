"""Shared fixtures: the real model bundle, the real QA data, and loaded models reused across tests."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from edge_rag.config import Config
from edge_rag.models import bundle as B
from edge_rag.models.registry import default_bundle
from edge_rag.retrieval.encode import Encoder

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("EDGE_RAG_DATA", ROOT.parent / "shared" / "data"))
SQUAD = DATA / "squad2_dev_subset.json"
HOTPOT = DATA / "hotpotqa_dev_subset.jsonl"
SAMPLE_DOCS = ROOT / "edge_rag" / "sample" / "docs"
STORES = ROOT / "tests" / ".cache" / "stores"  # stores several test files index the same way, built once


def cached_store(bundle_dir: Path, data: bytes, config: Config, build: Callable[[Path], None], into: Path) -> Path:
    """A copy at ``into`` of the store ``build(folder)`` makes, kept in tests/.cache keyed by everything it is made
    from (every file of edge_rag, the packaged sample corpus among them, the bundle's manifest, ``data``: the
    documents' file when they come from outside edge_rag, or the indexed folder's path, which the store records;
    the Config), so an edit to any of them builds it again; the tests write only to their copy."""
    key = hashlib.sha256(repr(config).encode() + (bundle_dir / B.MANIFEST).read_bytes() + data)
    for path in sorted((ROOT / "edge_rag").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            key.update(str(path.relative_to(ROOT)).encode() + path.read_bytes())
    done = STORES / key.hexdigest()[:16]
    if not done.is_dir():
        tmp = STORES / f".{done.name}.tmp-{os.getpid()}"
        try:
            build(tmp / "db")
            with contextlib.suppress(OSError):  # another file's build landed first: same key, same store
                os.replace(tmp, done)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for stale in STORES.iterdir():  # stores of older code or settings, untouched for a week
            if stale.stat().st_mtime < time.time() - 7 * 86400:
                shutil.rmtree(stale, ignore_errors=True)
    os.utime(done)
    shutil.copytree(done / "db", into)
    return into


def on_emulated_haswell(script: str, args: list[str], stdin: str | None = None, env: dict[str, str] | None = None,
                        timeout: float = 900) -> object:
    """``python -c script *args`` under ``qemu-x86_64 -cpu Haswell`` (AVX2, no AVX-512 or VNNI: the kernel path of
    the kiosks a suite run on another CPU cannot own), its last output line read as JSON. Skips where qemu-x86_64
    cannot run this interpreter: not installed (`make test` installs qemu-user via apt when run as root), or a host
    that is not x86-64."""
    qemu = shutil.which("qemu-x86_64")
    if qemu is None or platform.machine() != "x86_64":
        pytest.skip("needs qemu-x86_64 on an x86-64 host (`make test` installs qemu-user via apt when run as root)")
    out = subprocess.run([qemu, "-cpu", "Haswell", sys.executable, "-c", script, *args], input=stdin,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                         timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


EMULATED_SHARE = 8  # emulated checks re-embed the 8 shortest of the 64 reference sentences (8-10 tokens each)


def reference_share(bundle: B.Bundle, out: Path) -> Path:
    """The bundle's reference set cut to its ``EMULATED_SHARE`` shortest sentences (in tokens, kept in order), written
    to ``out``: an emulated CPU's cost grows with the tokens embedded (all 64 sentences, 941 tokens: ~60 s of CPU under
    qemu-aarch64, ~165 s under qemu-x86_64 -cpu Haswell; these 8, 73 tokens: ~2 s and ~4 s, and the install's 21
    timed single-sentence queries on them ~4 s under qemu-aarch64). The bundle's int8 encoder passes on them on both
    emulated CPUs as on all 64 (cosine mean 0.9916, min 0.9885); a per-tensor int8 encoder fails on them as on all 64
    (cosine mean 0.962, min 0.947): test_verify checks that it still does."""
    from tokenizers import Tokenizer

    from edge_rag.models.verify import load_reference, save_reference

    texts, vectors = load_reference(bundle.require(B.ROLE_REFERENCE))
    tokenizer = Tokenizer.from_file(str(bundle.require(B.ROLE_TOKENIZER)))
    tokenizer.no_padding()  # the bundle's tokenizer.json pads every text to 128 tokens; the encoder does not
    tokens = [len(e.ids) for e in tokenizer.encode_batch(texts)]
    keep = sorted(sorted(range(len(texts)), key=lambda i: tokens[i])[:EMULATED_SHARE])
    return save_reference(out, [texts[i] for i in keep], vectors[keep])


@pytest.fixture(scope="session")
def bundle_dir() -> Path:
    path = default_bundle("gemma")
    if not (path / B.MANIFEST).is_file():
        pytest.fail(f"no model bundle at {path}: run `make models` (make test does it for you)")
    return path


@pytest.fixture(scope="session")
def bundle(bundle_dir: Path) -> B.Bundle:
    return B.Bundle.load(bundle_dir)


@pytest.fixture(scope="session")
def encoder(bundle: B.Bundle) -> Encoder:
    return Encoder(bundle.require(B.ROLE_ENCODER), bundle.require(B.ROLE_TOKENIZER))


@pytest.fixture(scope="session")
def squad_path() -> Path:
    if not SQUAD.is_file():
        pytest.skip(f"SQuAD subset not found at {SQUAD} (see ../shared/data/README.md)")
    return SQUAD


@pytest.fixture(scope="session")
def hotpot_path() -> Path:
    if not HOTPOT.is_file():
        pytest.skip(f"HotpotQA subset not found at {HOTPOT} (see ../shared/data/README.md)")
    return HOTPOT


@pytest.fixture(scope="session")
def pg_admin_url():
    """A PostgreSQL superuser URL (pgvector tests): ``$EDGE_RAG_PG_URL``, or a throw-away server started here and
    stopped after."""
    if os.environ.get("EDGE_RAG_PG_URL"):
        yield os.environ["EDGE_RAG_PG_URL"]
        return
    try:
        from benchmarks.pgserver import PgServer

        server = PgServer({"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}).start()
    except ImportError as exc:
        pytest.skip(f"no PostgreSQL for the pgvector tests: {exc}; or set EDGE_RAG_PG_URL")
    yield server.url
    server.stop()


@contextlib.contextmanager
def fresh_database(admin_url: str, options: str = ""):
    """The URL of a new database on the server ``admin_url`` reaches (made with CREATE DATABASE ``options``), dropped
    on exit."""
    psycopg = pytest.importorskip("psycopg", reason="the pg extra is not installed: pip install 'edge-rag[pg]'")
    name = f"edge_rag_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} {options}")
    parts = urlsplit(admin_url)
    yield urlunsplit(parts._replace(path=f"/{name}"))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture
def pg_url(pg_admin_url):
    """A fresh database on the server, dropped after the test."""
    with fresh_database(pg_admin_url) as url:
        yield url


def sample_store(bundle_dir: Path, into: Path) -> Path:
    """A copy at ``into`` of the packaged sample corpus indexed with the default Config (sentence passages), the
    store itself built once and kept in tests/.cache: a dozen test files open it."""
    from edge_rag.pipeline import EdgeRAG

    def build(folder: Path) -> None:
        with EdgeRAG(folder, bundle=bundle_dir) as rag:
            rag.add_files([SAMPLE_DOCS])

    return cached_store(bundle_dir, str(SAMPLE_DOCS).encode(), Config(), build, into)


@pytest.fixture(scope="session")
def sample_rag(bundle_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """EdgeRAG over the packaged sample corpus (sentence passages), on this process's copy of the store."""
    from edge_rag.pipeline import EdgeRAG

    rag = EdgeRAG(sample_store(bundle_dir, tmp_path_factory.mktemp("sample-db") / "db"), bundle=bundle_dir,
                  config=Config(temperature=0.0))
    yield rag
    rag.close()


@pytest.fixture(scope="session")
def squad_default_rag(bundle_dir: Path, squad_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """EdgeRAG with the default config (sentence passages) over every SQuAD subset paragraph, on a copy of the store
    tests/.cache keeps."""
    from edge_rag.pipeline import EdgeRAG
    from evaluation.datasets import load_squad

    docs, items = load_squad(squad_path)
    config = Config(temperature=0.0)

    def build(folder: Path) -> None:
        with EdgeRAG(folder, bundle=bundle_dir, config=config) as rag:
            rag.add_documents(docs)

    store = cached_store(bundle_dir, squad_path.read_bytes(), config, build, tmp_path_factory.mktemp("squad-sentences") / "db")
    rag = EdgeRAG(store, bundle=bundle_dir, config=config)
    yield rag, items
    rag.close()


@pytest.fixture(scope="session")
def sample_db(bundle_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed store of the packaged sample corpus; servers get copies (``shutil.copytree``)."""
    return sample_store(bundle_dir, tmp_path_factory.mktemp("sample-served") / "db")


@pytest.fixture(scope="session")
def served(bundle_dir: Path, sample_db: Path, tmp_path_factory: pytest.TempPathFactory):
    """(base URL, GPT-route questions) of a real uvicorn server over a copy of the sample store."""
    import shutil

    serving = pytest.importorskip("serving", reason="the serve extra (starlette, uvicorn, httpx) is not installed")
    from edge_rag.pipeline import EdgeRAG

    db = tmp_path_factory.mktemp("served") / "db"
    shutil.copytree(sample_db, db)
    rag = EdgeRAG(db, bundle=bundle_dir, config=serving.test_config())
    questions = serving.gpt_questions(rag, 4)
    with serving.running_server(rag) as url:
        yield url, questions


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium for the page tests (tests/browsing.py)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra: "
                                   "pip install 'edge-rag[dev]' (make test installs it)")
    from browsing import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    if not Path(CHROMIUM).is_file():
        pytest.skip("Chromium is not installed (make test runs `apt-get install -y chromium`; it needs root and apt)")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()
