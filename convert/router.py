"""Router MLP → ONNX: the tier classifier on the question's retrieval profile, checked with onnxruntime.

``python -m convert router --checkpoint router.pt --out router.onnx`` (or ``--random-init --seed 0``).
The graph takes ``features`` (batch, 16) float32 — the profile columns of ``edge_rag.retrieval.route.features``:
s1, s1 - s5, the score entropy, the term overlap at the top 1 / 3 / 10 hits, the terms the top 3 / 10 hits
cover together, the documents among the top 3, the question's terms, what the other documents among the top 3
add, where the next document starts and its score gap, the documents the question names by title among the top
3 / 10 and the documents among the top 10 — and returns ``logits``
(batch, 3) in the order of ``edge_rag.config.TIERS`` (cost order), which is also stored in the model's
``labels`` metadata. The input standardisation fitted on the training set is part of the graph
(``shift``/``scale`` buffers). A checkpoint of another width (an older router that also read the
embedding) loads and exports as it is; ``edge_rag.retrieval.route.columns`` feeds it its columns.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn

from convert.args import out_file
from convert.report import write_report
from edge_rag.config import TIERS
from edge_rag.errors import EdgeRAGError
from edge_rag.retrieval.route import PROFILE
from edge_rag.storage.fileio import atomic_path

IN_DIM = len(PROFILE)  # the profile only: the embedding made the router worse (convert/train_router.py --cv)
HIDDEN = (256, 64)
DROPOUT = 0.3
LABELS = tuple(t.value for t in TIERS)  # class index → tier

INPUT_NAME = "features"
OUTPUT_NAME = "logits"
OPSET = 17
LABELS_KEY = "labels"  # ONNX metadata_props entry: comma-separated class names

MAX_ABS_DIFF = 1e-5  # ONNX vs torch logits
PARITY_BATCHES = (1, 17)  # batch sizes checked: one query, and an odd batch through the dynamic axis


class RouterError(EdgeRAGError, ValueError):
    """The router checkpoint does not fit RouterMLP; the message names the file and tensor."""


class RouterMLP(nn.Module):
    """(x - shift) / scale → 256 → ReLU → Dropout(0.3) → 64 → ReLU → 3 (thesis §4.3.2, on the profile
    instead of the embedding). The standardisation puts cosines, gaps and overlaps on one scale."""

    def __init__(
        self,
        in_dim: int = IN_DIM,
        hidden: tuple[int, int] = HIDDEN,
        n_classes: int = len(LABELS),
        dropout: float = DROPOUT,
    ):
        super().__init__()
        self.register_buffer("shift", torch.zeros(in_dim))
        self.register_buffer("scale", torch.ones(in_dim))
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden[0]),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden[0], hidden[1]),
            nn.ReLU(),
            nn.Linear(hidden[1], n_classes),
        )

    def standardise(self, x: torch.Tensor) -> None:
        """Fit shift/scale to the training rows ``x`` (constant columns keep scale 1)."""
        std = x.std(0)
        self.shift.copy_(x.mean(0))
        self.scale.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net((features - self.shift) / self.scale)


def random_router(seed: int = 0) -> RouterMLP:
    """An untrained router with reproducible weights, for tests and for bundles built before training."""
    torch.manual_seed(seed)
    return RouterMLP().eval()


def save_router(model: RouterMLP, path: str | Path) -> None:
    """The checkpoint format ``load_router`` reads: the state_dict under ``state_dict``, labels beside it."""
    torch.save({"state_dict": model.state_dict(), "labels": list(LABELS)}, path)


def load_router(path: str | Path) -> RouterMLP:
    """A ``save_router`` checkpoint or a bare RouterMLP state_dict."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a file cut short, a pickle of custom classes (as convert gpt's checkpoints)
        raise RouterError(f"{path}: not a loadable torch checkpoint ({exc})") from exc
    state = obj.get("state_dict", obj) if isinstance(obj, dict) else None
    if not isinstance(state, dict):
        raise RouterError(f"{path}: expected a RouterMLP state_dict, got {type(obj).__name__}")
    labels = obj.get("labels", list(LABELS))
    if list(labels) != list(LABELS):
        raise RouterError(f"{path}: labels {labels} differ from the runtime's tiers {list(LABELS)}")
    first = state.get("net.0.weight")
    in_dim = first.shape[1] if isinstance(first, torch.Tensor) and first.dim() == 2 else IN_DIM
    model = RouterMLP(in_dim=in_dim)
    want = model.state_dict()
    for name in sorted(want, key=lambda n: not n.startswith("net.")):  # weights first: the likelier mistake
        tensor = want[name]
        if name not in state:
            raise RouterError(f"{path}: missing tensor {name!r}")
        if state[name].shape != tensor.shape:
            raise RouterError(
                f"{path}: tensor {name!r} has shape {tuple(state[name].shape)},"
                f" expected {tuple(tensor.shape)}"
            )
    extra = sorted(set(state) - set(want))
    if extra:
        raise RouterError(f"{path}: unexpected tensors {', '.join(extra)}")
    model.load_state_dict(state)
    return model.eval()


def export_router(model: RouterMLP, out_path: str | Path, *, seed: int = 0, replace_failed: bool = True) -> dict:
    """Export with a dynamic batch axis, compare with torch on random unit vectors, write the report. With
    ``replace_failed=False`` (train-router, whose --out is the shipped asset) an export that fails the check raises
    RouterError before the rename: the file at ``out_path`` and its report stay as they were."""
    model = model.eval()
    out_path = Path(out_path)
    # Written and checked beside out_path, then renamed over it: a kill mid-write left half a router.onnx beside the
    # previous export's passing report, which the bundle packed and the device could not load.
    with atomic_path(out_path) as tmp:
        with warnings.catch_warnings():  # the legacy exporter announces its own deprecation on every call
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(
                model,
                (torch.zeros(1, model.shift.shape[0]),),
                str(tmp),
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                opset_version=OPSET,
                dynamo=False,  # the TorchScript exporter gives a plain Gemm/Relu graph with a named dynamic axis
            )
        proto = onnx.load(str(tmp))
        onnx.helper.set_model_props(proto, {LABELS_KEY: ",".join(LABELS)})
        onnx.checker.check_model(proto)
        onnx.save(proto, str(tmp))

        session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(seed)
        max_diff = 0.0
        for batch in PARITY_BATCHES:
            x = _parity_rows(rng, batch, model.shift.shape[0])
            with torch.no_grad():
                ref = model(torch.from_numpy(x)).numpy()
            (got,) = session.run([OUTPUT_NAME], {INPUT_NAME: x})
            if got.shape != ref.shape:
                raise RouterError(
                    f"{out_path}: ONNX output shape {got.shape} for batch {batch}, expected {ref.shape}"
                )
            max_diff = max(max_diff, float(np.abs(got - ref).max()))
        report = {
            "artifact": "router",
            "opset": OPSET,
            "input": INPUT_NAME,
            "output": OUTPUT_NAME,
            "labels": list(LABELS),
            "batches": list(PARITY_BATCHES),
            "max_abs_diff": max_diff,
            "max_abs_diff_limit": MAX_ABS_DIFF,
            "file_bytes": tmp.stat().st_size,
            "passed": max_diff <= MAX_ABS_DIFF,
        }
        if not (report["passed"] or replace_failed):
            raise RouterError(f"{out_path.name} failed its parity check against torch (max |Δ| {max_diff:.2e} > "
                              f"{MAX_ABS_DIFF:g}); {out_path} is kept")
    write_report(out_path, report)
    return report


def _parity_rows(rng: np.random.Generator, batch: int, width: int) -> np.ndarray:
    """Rows like the runtime's: profile values in [0, 1] (counts are wider; parity needs no realism), led by an L2-normalised embedding for a router
    wider than the profile (an older one)."""
    lead = max(width - len(PROFILE), 0)
    emb = rng.standard_normal((batch, lead)).astype(np.float32)
    emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    return np.hstack([emb, rng.uniform(0, 1, (batch, width - lead)).astype(np.float32)])


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "router",
        help="router MLP checkpoint → ONNX, verified with onnxruntime",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path, help="router.pt (save_router format or a bare state_dict)")
    src.add_argument(
        "--random-init", action="store_true", help="export an untrained router (tests, bring-up)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --random-init and of the parity inputs")
    p.add_argument("--out", type=Path, required=True, help="ONNX file to write")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        model = random_router(args.seed) if args.random_init else load_router(args.checkpoint)
        report = export_router(model, out_file(args.out), seed=args.seed)
    except RouterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if report["passed"] else 1
