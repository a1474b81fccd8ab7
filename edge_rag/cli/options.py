"""The options the ``edge-rag`` commands share, and the EdgeRAG they open: one place turns flags into a Config.

A flag that sets a Config field is checked by Config's own rule for that field as the command line is parsed,
so a bad value stops with argparse's usage line, before any model loads.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..errors import ConfigError
from ..models.registry import PROFILES

if TYPE_CHECKING:
    from ..pipeline import EdgeRAG

# Config fields set by a flag of the same name (dashes for underscores) when the command has it and it is given
FLAG_FIELDS = ("temperature", "max_error_rate", "delta")


def open_rag(args: argparse.Namespace, create: bool = True, **config: Any) -> EdgeRAG:
    """The EdgeRAG a command works on: its store, bundle, calibration and the Config its flags ask for (and the
    command's own ``config`` fields)."""
    from ..pipeline import EdgeRAG

    changes = {name: getattr(args, name) for name in FLAG_FIELDS if getattr(args, name, None) is not None} | config
    if getattr(args, "memory_mb", None) is not None:
        changes["memory_budget_mb"] = args.memory_mb
    if getattr(args, "threads", None):
        changes["threads"] = args.threads
    if getattr(args, "seed_decision", False):
        changes["certified"] = False
    return EdgeRAG(args.db, bundle=args.bundle, config=Config().with_(**changes), profile=args.profile,
                   create=create, lock_timeout=getattr(args, "wait", 0.0),
                   calibration=getattr(args, "calibration", None))


def config_value(name: str) -> Callable[[str], float]:
    """An argparse type for the Config field ``name``: a number (a whole one for an int field) its range allows,
    else the Config's message."""
    whole = Config.__dataclass_fields__[name].type == "int"

    def parse(text: str) -> float:
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {'whole ' if whole else ''}number: {text!r}") from None
        try:
            change: dict[str, Any] = {name: value}  # any field's name
            Config(**change)
        except ConfigError as exc:  # it names the field and what it allows
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value
    return parse


def positive(what: str) -> Callable[[str], int]:
    """An argparse type: a whole number above 0, ``what`` naming it in the message (e.g. "MB")."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number of {what}: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"the number of {what} must be positive, not {value}")
        return value
    return parse


def seconds(text: str) -> float:
    """--wait: a finite number of seconds, 0 or more (NaN waited forever, a negative number not at all)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"seconds must be a finite number, 0 or more, not {text!r}")
    return value


def add_wait(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", type=seconds, default=0.0, metavar="SECONDS",
                   help="if another process is writing to the store, wait this long for it (default: fail at once)")


def add_delta(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--delta", type=config_value("delta"), metavar="DELTA", help=what)


def add_decision(p: argparse.ArgumentParser) -> None:
    """--calibration, --max-error-rate and --delta: which certificate decides, at what error and confidence."""
    d = Config()
    p.add_argument("--calibration", metavar="FILE",
                   help="a calibration made by `edge-rag calibrate` on this device's own questions "
                        "(default: the shipped one, certified on SQuAD-2 questions)")
    p.add_argument("--max-error-rate", type=config_value("max_error_rate"), metavar="ALPHA",
                   help=f"the error among answered questions the decision certifies (default {d.max_error_rate:g})")
    add_delta(p, f"the certificate holds with probability 1 - DELTA, 0 < DELTA < 1 (default {d.delta:g})")


def add_common(p: argparse.ArgumentParser, db_required: bool = True) -> None:
    p.add_argument("--db", required=db_required,
                   help="passage store: a folder, or postgresql://user@host/dbname (needs edge-rag[pg])")
    p.add_argument("--bundle", help="model bundle folder (default: the pulled bundle of --profile)")
    p.add_argument("--profile", default="gemma", choices=sorted(PROFILES))
    p.add_argument("--memory-mb", type=positive("MB"),
                   help=f"memory budget for the whole process, MB (default {Config().memory_budget_mb})")
    p.add_argument("--threads", type=config_value("threads"),
                   help="CPU threads (default: OMP_NUM_THREADS, else all cores)")
    p.add_argument("--seed-decision", action="store_true",
                   help="the seeds' answer/refuse decision (generates for open questions; its answers are not "
                        "certified) instead of the certified default")
