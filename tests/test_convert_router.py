"""Router MLP → ONNX: architecture, parity with torch, dynamic batch, checkpoint errors, CLI."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from convert.__main__ import main
from convert.router import (
    IN_DIM,
    INPUT_NAME,
    LABELS,
    LABELS_KEY,
    MAX_ABS_DIFF,
    OUTPUT_NAME,
    RouterError,
    RouterMLP,
    export_router,
    load_router,
    random_router,
    save_router,
)
from edge_rag.retrieval.route import PROFILE


def test_architecture_matches_design():
    layers = [type(m).__name__ for m in RouterMLP().net]
    assert layers == ["Linear", "ReLU", "Dropout", "Linear", "ReLU", "Linear"]
    shapes = [tuple(p.shape) for p in RouterMLP().parameters()]
    assert IN_DIM == len(PROFILE)  # the retrieval profile alone (the embedding made it worse: train-router --cv)
    assert shapes == [(256, IN_DIM), (256,), (64, 256), (64,), (3, 64), (3,)]


def test_standardisation_is_part_of_the_model(tmp_path):
    """shift/scale fitted on training rows travel in the checkpoint and the ONNX graph."""
    x = torch.randn(50, IN_DIM) * 3 + 1
    model = random_router(2)
    model.standardise(x)
    z = (x - model.shift) / model.scale
    assert torch.allclose(z.mean(0), torch.zeros(IN_DIM), atol=1e-4) and torch.allclose(z.std(0), torch.ones(IN_DIM))
    save_router(model, tmp_path / "router.pt")
    assert torch.equal(load_router(tmp_path / "router.pt").shift, model.shift)
    export_router(model, tmp_path / "r.onnx")
    session = ort.InferenceSession(str(tmp_path / "r.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        ref = model(x[:5]).numpy()
    assert np.abs(session.run(None, {INPUT_NAME: x[:5].numpy()})[0] - ref).max() <= 1e-4
    assert RouterMLP().net[2].p == 0.3
    assert LABELS == ("EASY", "MEDIUM", "HARD")


def test_random_init_is_reproducible():
    a, b, c = random_router(1), random_router(1), random_router(2)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.net[0].weight, c.net[0].weight)


def test_export_parity_and_dynamic_batch(tmp_path):
    model = random_router(0)
    out = tmp_path / "router.onnx"
    report = export_router(model, out)
    assert report["passed"] and report["max_abs_diff"] <= MAX_ABS_DIFF
    assert json.loads((tmp_path / "router.onnx.parity.json").read_text())["passed"] is True

    proto = onnx.load(str(out))
    assert proto.opset_import[0].version >= 17
    assert {p.key: p.value for p in proto.metadata_props}[LABELS_KEY] == "EASY,MEDIUM,HARD"
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [INPUT_NAME]
    assert [o.name for o in session.get_outputs()] == [OUTPUT_NAME]
    assert isinstance(session.get_inputs()[0].shape[0], str)  # symbolic batch axis

    rng = np.random.default_rng(7)
    for batch in (1, 17):
        x = rng.standard_normal((batch, IN_DIM)).astype(np.float32)
        (got,) = session.run([OUTPUT_NAME], {INPUT_NAME: x})
        with torch.no_grad():
            ref = model(torch.from_numpy(x)).numpy()
        assert got.shape == (batch, 3)
        assert np.abs(got - ref).max() <= 1e-5


def test_dropout_is_off_in_export(tmp_path):
    model = random_router(3).train()  # export must not bake in training-mode dropout
    out = tmp_path / "r.onnx"
    export_router(model, out)
    x = np.full((4, IN_DIM), 0.5, np.float32)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    a = session.run(None, {INPUT_NAME: x})[0]
    assert np.allclose(a, session.run(None, {INPUT_NAME: x})[0])
    assert np.allclose(a[0], a[3])


def test_checkpoint_round_trip_and_bare_state_dict(tmp_path):
    model = random_router(5)
    save_router(model, tmp_path / "router.pt")
    torch.save(model.state_dict(), tmp_path / "bare.pt")
    for name in ("router.pt", "bare.pt"):
        loaded = load_router(tmp_path / name)
        assert all(torch.equal(x, y) for x, y in zip(model.parameters(), loaded.parameters(), strict=True))


def test_an_older_wider_checkpoint_loads_and_exports(tmp_path):
    """Routers trained before the profile-only one read the embedding and profile (390 inputs): still converted."""
    torch.manual_seed(0)
    old = RouterMLP(in_dim=384 + len(PROFILE)).eval()
    save_router(old, tmp_path / "old.pt")
    loaded = load_router(tmp_path / "old.pt")
    assert loaded.shift.shape == (384 + len(PROFILE),)
    assert export_router(loaded, tmp_path / "old.onnx")["passed"]


def test_checkpoint_errors_name_the_tensor(tmp_path):
    state = random_router(0).state_dict()
    bad_shape = {**state, "net.3.weight": torch.zeros(32, 256)}
    torch.save(bad_shape, tmp_path / "shape.pt")
    with pytest.raises(RouterError, match=r"net\.3\.weight.*\(32, 256\).*\(64, 256\)"):
        load_router(tmp_path / "shape.pt")
    missing = {k: v for k, v in state.items() if k != "net.5.bias"}
    torch.save(missing, tmp_path / "missing.pt")
    with pytest.raises(RouterError, match=r"missing tensor 'net\.5\.bias'"):
        load_router(tmp_path / "missing.pt")
    torch.save({"state_dict": state, "labels": ["HARD", "MEDIUM", "EASY"]}, tmp_path / "labels.pt")
    with pytest.raises(RouterError, match="labels"):
        load_router(tmp_path / "labels.pt")


def test_cli(tmp_path, capsys):
    save_router(random_router(4), tmp_path / "router.pt")
    assert (
        main(["router", "--checkpoint", str(tmp_path / "router.pt"), "--out", str(tmp_path / "a.onnx")]) == 0
    )
    assert main(["router", "--random-init", "--seed", "4", "--out", str(tmp_path / "b.onnx")]) == 0
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    assert "[PASS] a.onnx" in capsys.readouterr().out
    torch.save({"net.0.weight": torch.zeros(1)}, tmp_path / "bad.pt")
    assert main(["router", "--checkpoint", str(tmp_path / "bad.pt"), "--out", str(tmp_path / "c.onnx")]) == 2
    assert "net.0.weight" in capsys.readouterr().err


def test_an_export_cut_short_leaves_the_previous_router_whole(tmp_path):
    """A write cut short (the file-size limit here: EFBIG part-way, as a full disk or a kill would) left half a
    router.onnx beside the previous export's passing report, which `convert bundle` packed and the device's Router
    could not load (INVALID_PROTOBUF); the previous router now stays whole."""
    import subprocess
    import sys

    from edge_rag.retrieval.route import Router

    out = tmp_path / "router.onnx"
    assert main(["router", "--random-init", "--out", str(out)]) == 0
    before = out.read_bytes()
    code = ("import resource, sys\nfrom convert.__main__ import main\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before) // 2}, {len(before) // 2}))\n"
            "main(['router', '--random-init', '--seed', '1', '--out', sys.argv[1]])\n")
    failed = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
    assert failed.returncode != 0 and "File too large" in failed.stderr, failed.stderr[-300:]
    assert out.read_bytes() == before and json.loads(out.with_name("router.onnx.parity.json").read_text())["passed"]
    Router(out)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left behind


def test_a_failing_export_for_the_shipped_router_leaves_it_in_place(tmp_path, monkeypatch):
    """train-router exports over edge_rag/assets/router.onnx: one that failed its parity check (exit 1) replaced the
    shipped router and its passing report. It is now checked beside them and refused before the rename."""
    import convert.router as R

    out = tmp_path / "router.onnx"
    assert main(["router", "--random-init", "--out", str(out)]) == 0
    before, report = out.read_bytes(), out.with_name("router.onnx.parity.json").read_text()
    monkeypatch.setattr(R, "MAX_ABS_DIFF", -1.0)  # no export meets it
    with pytest.raises(RouterError, match="failed its parity check.*is kept"):
        export_router(random_router(1), out, replace_failed=False)
    assert out.read_bytes() == before and out.with_name("router.onnx.parity.json").read_text() == report
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left behind


def test_a_parity_report_write_cut_short_keeps_the_previous_report(tmp_path, monkeypatch):
    """The parity report is rewritten by every export: a write cut short (ENOSPC part-way) left half a JSON, on which
    `convert bundle` failed with a JSONDecodeError. The previous report stays whole; it is of the previous file."""
    import errno
    from pathlib import Path

    from convert.report import of_file, read_report

    out = tmp_path / "router.onnx"
    assert main(["router", "--random-init", "--out", str(out)]) == 0
    real = Path.write_text

    def cut_short(self, text, *args, **kwargs):
        if "parity.json" in self.name:
            real(self, text[:len(text) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, text, *args, **kwargs)
    monkeypatch.setattr(Path, "write_text", cut_short)
    with pytest.raises(OSError, match="No space left"):
        main(["router", "--random-init", "--seed", "1", "--out", str(out)])
    report = read_report(out)
    assert report is not None and report["passed"] and not of_file(out, report)  # bundle refuses the new file
