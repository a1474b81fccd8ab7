"""``python -m convert {encoder,gpt,router,bundle,...} --help``."""
from __future__ import annotations

import argparse
import importlib
import sys

# Each module registers its own sub-command with ``register(subparsers)``.
COMMANDS = ("encoder", "gpt", "router", "bundle", "train_router", "train_reader", "reader_report", "calibrate", "kernels")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m convert", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"convert.{name}").register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
