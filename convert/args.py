"""Argument types the convert sub-commands share: a nonsense value is refused when parsed, before any work."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def at_least(low: float, kind: type = int) -> Callable[[str], float]:
    """An argparse type: a number >= ``low``, so a nonsense value is a usage error before minutes of work
    (train-reader's ``--examples -5`` was a ValueError traceback of random.sample after building its examples)."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value >= low:
            raise argparse.ArgumentTypeError(f"{text} is below {low}")
        return value
    return parse


class InputError(Exception):
    """An input the command cannot read (a model file cut short): ``python -m convert`` says so in one line, status 2,
    as for a bad argument, not a traceback of the library that read it."""


def existing_file(text: str) -> Path:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return Path(text)


def model_folder(folder: str | Path) -> Path:
    """``folder`` when it holds a Hugging Face model, else an InputError (a missing one was a FileNotFoundError
    traceback); checked when the command runs, not when parsed: the docs' commands parse with placeholder paths."""
    missing = [n for n in ("config.json", "model.safetensors", "tokenizer.json") if not (Path(folder) / n).is_file()]
    if missing:
        raise InputError(f"{folder}: no {', '.join(missing)} (not a model folder)")
    return Path(folder)


def out_file(path: Path) -> Path:
    """``path`` unless it is a folder (``--out outdir`` was an IsADirectoryError traceback after the whole export)."""
    if path.is_dir():
        raise InputError(f"--out {path} is a folder: name the file to write")
    return path
