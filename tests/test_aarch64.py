"""The device side on an emulated Raspberry Pi 4 CPU (``qemu-aarch64 -cpu cortex-a72``: ARMv8 NEON, no
dotprod) on every `make test`: the runtime installed for aarch64 from the registries (no torch, no
llama.cpp: the RAG route never loads it), the bundle archive installed as on a device (its int8 encoder
gated on onnxruntime's ARM kernels), a sample document indexed and its questions answered exactly
as on x86. `make pi-check` runs the whole check (llama.cpp for aarch64, the GPT route, the reader, tests).

The archive is the bundle's with its reference set cut to a share (``reference_share``: the install's int8 gate on
the 8 shortest of the 64 sentences), and one document (15 passages) with its two questions is indexed and asked
(one answered and one refused today; answer, route, tier and refusal kind compared with x86): every emulated
passage costs ~0.65 s of CPU to embed (three documents, 46 passages, took 33 s of the index step)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import EMULATED_SHARE, reference_share

from benchmarks import pi_check
from convert import aarch64
from convert.bundle import archive, assemble
from edge_rag.models import bundle as B
from edge_rag.models import registry as M

DOCS = ("08-history-of-the-building.md",)  # "Why is the museum called Harbourlight?" and a refused question


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> aarch64.Env:
    missing = aarch64.missing_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (`make test` installs qemu-user, debootstrap and "
                    "g++-aarch64-linux-gnu with apt when run as root)")
    if os.geteuid() != 0:
        pytest.skip("debootstrap unpacks the arm64 Debian root only as root")
    try:
        return aarch64.install(tmp_path_factory.mktemp("aarch64") / "site", llama=False)
    except RuntimeError as exc:  # a registry (Debian mirror, PyPI) out of reach, or the cross build failed
        pytest.skip(f"could not build the aarch64 environment: {exc}")


def test_bundle_archive_installs_and_answers_as_on_x86(env: aarch64.Env, bundle: B.Bundle, tmp_path: Path) -> None:
    questions = [q for q in json.loads((pi_check.SAMPLE / "questions.json").read_text()) if q["doc"] in DOCS]
    files = {f["role"]: bundle.root / f["name"] for f in bundle.files()}
    files[B.ROLE_REFERENCE] = reference_share(bundle, tmp_path / "reference.npz")
    assemble(tmp_path / "bundle", files, "gemma", bundle.encoder, M.PROFILES[bundle.manifest["profile"]])
    tar = archive(tmp_path / "bundle", tmp_path / "edge-rag-gemma.tar")
    result = pi_check.install_and_ask(env, tmp_path, tar, [pi_check.SAMPLE / "docs" / d for d in DOCS],
                                      [q["question"] for q in questions])
    installed = result["steps"]["install aarch64"].out
    assert "int8 encoder on aarch64 ASIMD" in installed and f"{EMULATED_SHARE} sentences: PASS" in installed, installed
    assert len(result["aarch64"]) == len(questions) == 2 and any(a["answer"] is not None for a in result["x86"])
    assert result["differences"] == []  # answer, route, tier and refusal reason
    assert result["steps"]["ask aarch64"].peak_rss_mb > 0
