"""``python -m convert {encoder,gpt,router,bundle,...} --help``."""
from __future__ import annotations

import argparse
import importlib
import sys

from convert.args import InputError
from edge_rag.errors import BundleError

# Each module registers its own sub-command with ``register(subparsers)``: sub-command → module.
COMMANDS = {"encoder": "encoder", "gpt": "gpt", "router": "router", "bundle": "bundle", "train-router": "train_router",
            "train-reader": "train_reader", "score-reader": "reader_report", "calibrate": "calibrate",
            "kernels": "kernels"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m convert", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    # Only the named sub-command's module: each imports its own heavy libraries (transformers, onnx, torch), seconds
    # of CPU; no name, or an unknown one, lists them all.
    named = argv[:1] if argv[:1] and argv[0] in COMMANDS else COMMANDS
    for name in named:
        importlib.import_module(f"convert.{COMMANDS[name]}").register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (InputError, BundleError) as exc:  # an input that does not read, named by its path
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
