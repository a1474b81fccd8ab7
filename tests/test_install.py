"""Host builds, device installs: a bundle archive installed by the runtime alone, in a fresh venv that
has no torch, answers a question; a bad archive leaves the installed bundle untouched."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from edge_rag.errors import BundleError
from edge_rag.models import bundle as B
from edge_rag.models.install import install
from edge_rag.models.registry import default_bundle

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def archive(bundle_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from convert.bundle import archive

    return archive(bundle_dir, tmp_path_factory.mktemp("archive") / "edge-rag-gemma.tar")


def test_install_makes_the_default_and_a_bad_archive_changes_nothing(archive: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_RAG_HOME", str(tmp_path))
    dest, verdicts = install(archive)
    assert dest == default_bundle("gemma") and verdicts and verdicts[0].passed
    with tarfile.open(archive) as tar:
        assert B.Bundle.load(dest).manifest == json.loads(tar.extractfile(B.MANIFEST).read())
    before = sorted(p.name for p in dest.iterdir())

    bad = tmp_path / "bad.tar"
    with tarfile.open(archive) as src, tarfile.open(bad, "w") as out:
        for name in (B.MANIFEST, "tokenizer.json"):
            data = src.extractfile(name).read()
            info = src.getmember(name)
            out.addfile(info, io.BytesIO(data))
    with pytest.raises(BundleError, match=r"bundle file missing: .*\.install-\w+/\w+\.onnx"):
        install(bad)
    assert sorted(p.name for p in dest.iterdir()) == before
    assert not list((tmp_path / "bundles").glob(".install-*"))  # staging cleaned up
    with pytest.raises(BundleError, match="no archive at"):
        install(tmp_path / "absent.tar")


def _run(cmd: list, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=timeout)


def test_torch_free_venv_installs_the_archive_and_answers(archive: Path, tmp_path: Path) -> None:
    """pip installs the runtime alone (its dependencies from pip's cache after `make install`): the wheel of this
    checkout, built from a copy (another test file may be building one at the same time). This environment's pip
    installs into the venv (``pip --python``; the venv gets no pip of its own) without compiling every module of
    every dependency (``--no-compile``; what runs compiles on import): 6 s of CPU, where the venv's own pip took 21."""
    from convert.wheel import checkout_wheel

    if not os.environ.get("EDGE_RAG_WHEELS"):
        pytest.skip("run it through `make test ARGS=tests/test_install.py`: it passes the llama-cpp-python wheel it "
                    "built (EDGE_RAG_WHEELS); without it pip compiles llama.cpp here, natively (15 min on 2 cores)")
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["EDGE_RAG_HOME"] = str(tmp_path / "home")
    base = getattr(sys, "_base_executable", sys.executable)
    assert _run([base, "-m", "venv", "--without-pip", venv], env).returncode == 0
    py, cli = venv / "bin" / "python", venv / "bin" / "edge-rag"
    # `make test` passes the folder of the llama-cpp-python wheel it built (AVX2 baseline on x86-64, see the
    # Makefile) so this venv gets that build rather than a source build with the host's native flags.
    wheels = ["--find-links", os.environ["EDGE_RAG_WHEELS"]]
    before = sorted(p.name for p in ROOT.iterdir())
    ours = checkout_wheel(tmp_path / "wheel")
    assert sorted(p.name for p in ROOT.iterdir()) == before  # no build/ or *.egg-info written into the checkout
    pip = _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-compile",
                "--disable-pip-version-check", *wheels, ours], env)
    assert pip.returncode == 0, pip.stderr[-3000:]

    no_torch = _run([py, "-c", "import torch"], env)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    pull = _run([cli, "models", "pull"], env)
    assert pull.returncode == 2 and "cannot build a bundle" in pull.stderr and "models install" in pull.stderr

    installed = _run([cli, "models", "install", archive], env)
    assert installed.returncode == 0, installed.stdout + installed.stderr[-3000:]
    assert ": PASS" in installed.stdout and "installed" in installed.stdout
    db, docs = tmp_path / "db", tmp_path / "docs"
    docs.mkdir()  # the sample's founder document alone: the same folder walk, parser and encoder as the thirty
    shutil.copy(ROOT / "edge_rag" / "sample" / "docs" / "09-founder-margaret-hollins.md", docs)
    indexed = _run([cli, "index", docs, "--db", db, "--quiet"], env)
    assert indexed.returncode == 0, indexed.stderr[-3000:]
    asked = _run([cli, "ask", "Who founded the Harbourlight Science Museum?", "--db", db, "--json",
                  "--temperature", "0"], env)
    assert asked.returncode == 0, asked.stderr[-3000:]
    answer = json.loads(asked.stdout)
    assert "Hollins" in (answer["answer"] or ""), answer
    assert _run([py, "-c", "import edge_rag, sys; assert 'torch' not in sys.modules"], env).returncode == 0
    typed = "import edge_rag, pathlib; assert (pathlib.Path(edge_rag.__file__).parent / 'py.typed').is_file()"
    assert _run([py, "-c", typed], env).returncode == 0  # type checkers see the installed package's hints
