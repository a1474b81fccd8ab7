"""Assemble a bundle folder the runtime loads: encoder, tokenizer, GGUF generator, optional router.

The manifest (``edge_rag.bundle``'s documented format) records every file's size and sha256 plus the
parity reports each converter wrote beside its artifact, so a device can tell what it runs and how
faithful each export was.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
from pathlib import Path

from edge_rag import bundle as B
from edge_rag.config import TIERS


def _report(artifact: Path) -> dict | None:
    path = Path(str(artifact) + ".parity.json")
    return json.loads(path.read_text()) if path.is_file() else None


def assemble(out: Path, encoder: Path, tokenizer: Path, generator: Path, router: Path | None = None,
             prompt_style: str = "one-shot", generator_name: str = "", generator_license: str = "",
             profile: str = "custom") -> Path:
    """Copy the artifacts into ``out`` under their bundle names and write ``manifest.json``."""
    out.mkdir(parents=True, exist_ok=True)
    sources = {B.ROLE_ENCODER: (encoder, "encoder.onnx"), B.ROLE_TOKENIZER: (tokenizer, "tokenizer.json"),
               B.ROLE_GENERATOR: (generator, "generator.gguf")}
    if router is not None:
        sources[B.ROLE_ROUTER] = (router, "router.onnx")
    for src, name in sources.values():
        if not src.is_file():
            raise SystemExit(f"convert bundle: {src} does not exist")
        shutil.copyfile(src, out / name)
    enc_report = _report(encoder) or {}
    return B.write_manifest(
        out,
        {role: name for role, (_, name) in sources.items()},
        profile=profile,
        encoder={"name": encoder.name, "dim": enc_report.get("dim", 384), "pooling": "mean", "normalize": True,
                 "max_seq_len": enc_report.get("max_seq_len", 256), "precision": enc_report.get("kind", "fp32"),
                 "parity": enc_report or None},
        generator={"name": generator_name or generator.name, "license": generator_license,
                   "prompt_style": prompt_style, "parity": _report(generator)},
        router={"labels": [t.value for t in TIERS], "parity": _report(router)} if router else None,
        versions={"python": platform.python_version()},
    )


def run(args: argparse.Namespace) -> int:
    path = assemble(Path(args.out), Path(args.encoder), Path(args.tokenizer), Path(args.gguf),
                    Path(args.router) if args.router else None, args.prompt_style, args.name, args.license)
    B.Bundle.load(path.parent)  # what we wrote must verify
    print(f"bundle written to {path.parent}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bundle", help="assemble encoder + tokenizer + GGUF (+ router) with a manifest")
    p.add_argument("--out", required=True, help="bundle folder to write")
    p.add_argument("--encoder", required=True, help="encoder ONNX (from `convert encoder`)")
    p.add_argument("--tokenizer", required=True, help="the encoder's tokenizer.json")
    p.add_argument("--gguf", required=True, help="generator GGUF (from `convert gpt` or any llama.cpp model)")
    p.add_argument("--router", help="router ONNX (from `convert router` / `convert train-router`)")
    p.add_argument("--prompt-style", default="one-shot", choices=["one-shot", "chat"],
                   help="one-shot for base models, chat for instruct models with a chat template")
    p.add_argument("--name", default="", help="generator model name for the manifest")
    p.add_argument("--license", default="", help="generator license for the manifest")
    p.set_defaults(func=run)
