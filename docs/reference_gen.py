"""The reference pages' generated parts, read from the code: dataclass fields with the comments beside them (Config,
Answer, ServeConfig), the CLI from its argparse parsers, the HTTP API from the route table (docs/hooks.py calls
these at build time)."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import io
import re
import sys
import tokenize
from collections.abc import Mapping
from enum import Enum
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class GenerateError(Exception):
    """A generated part that cannot be written (a field without a description, a missing results file)."""


# -- dataclass fields with the comments beside them -----------------------------------------------------------
def field_comments(path: Path, class_name: str) -> tuple[dict[str, str], dict[str, str]]:
    """Each field's comment (the block right above it plus the one on its line), and the section each field is
    in (the last ``# -- heading`` comment line above it), read from the class's source."""
    source = path.read_text(encoding="utf-8")
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == class_name)
    start, end = cls.lineno, cls.end_lineno or cls.lineno
    field_lines = {n.lineno: n.target.id for n in cls.body
                   if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and start <= tok.start[0] <= end:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    meaning: dict[str, str] = {}
    section: dict[str, str] = {}
    block: list[str] = []
    heading = ""
    for number in range(start, end + 1):
        text = lines[number - 1].strip()
        if number in field_lines:
            name = field_lines[number]
            meaning[name] = " ".join(block + ([comments[number]] if number in comments else []))
            section[name] = heading
            block = []
        elif text.startswith("#") and comments[number].startswith("--"):
            heading, block = comments[number][2:].strip(), []
        elif text.startswith("#"):
            block.append(comments[number])
        else:
            block = []
    return meaning, section


def _value(value: object) -> str:
    if isinstance(value, Mapping) and not isinstance(value, dict):
        return "see below"  # Config.tiers: its own table
    if isinstance(value, Enum):
        return repr(value.value)
    return repr(value)


def _cell(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|").replace("\n", " ")


def _fields_table(cls: type, path: Path, allowed: dict[str, str] | None = None) -> str:
    meaning, section = field_comments(path, cls.__name__)
    rows, last = [], None
    missing = [f.name for f in dataclasses.fields(cls) if not meaning.get(f.name)]
    if missing:
        raise GenerateError(f"{cls.__name__} fields without a comment saying what they mean: {', '.join(missing)} "
                            f"({path.relative_to(ROOT)})")
    out = []
    for f in dataclasses.fields(cls):
        if section.get(f.name) != last:
            if rows:
                out.append(_table(rows, allowed is not None))
                rows = []
            last = section.get(f.name)
            if last:
                out.append(f"\n### {_cell(last[0].upper() + last[1:])}\n")
        if f.default is not dataclasses.MISSING:
            default = "`" + _value(f.default).replace("|", "\\|") + "`"  # code: no HTML entities
        elif f.default_factory is not dataclasses.MISSING:
            default = "`" + _value(f.default_factory()).replace("|", "\\|") + "`"
        else:
            default = "required"
        row = [f"`{f.name}`", default]
        if allowed is not None:
            row.append(_cell(allowed.get(f.name, f.type if isinstance(f.type, str) else f.type.__name__)))
        rows.append(row + [_cell(meaning.get(f.name, ""))])
    out.append(_table(rows, allowed is not None))
    return "\n".join(out)


def _table(rows: list[list[str]], with_allowed: bool) -> str:
    head = ["field", "default"] + (["allowed"] if with_allowed else []) + ["meaning"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def config_table() -> str:
    from edge_rag import config as C

    allowed = {name: ", ".join(f"`{v}`" for v in values) for name, values in C._CHOICES.items()}
    for name, (low, high, low_in, high_in, integer) in C._RANGES.items():
        high = C.INT_MAX if integer and high is None else high  # as _check_range bounds every count
        bounds = [f"{'≥' if low_in else '>'} {low}" if low is not None else "",
                  f"{'≤' if high_in else '<'} {high}" if high is not None else ""]
        allowed[name] = (("integer" if integer else "number") + " " + " and ".join(b for b in bounds if b)).strip()
    allowed["tiers"] = "a `Tiers` / dict mapping EASY, MEDIUM, HARD to a `TierSpec`"
    for name in ("fallback_tier", "tier_override"):
        allowed[name] = ", ".join(f"`{t.value}`" for t in C.TIERS) + (", `None`" if name == "tier_override" else "")
    for f in dataclasses.fields(C.Config):
        if f.type == "bool":
            allowed[f.name] = "`True`, `False`"
    return (_fields_table(C.Config, ROOT / "edge_rag" / "config.py", allowed)
            + "\n**The default `tiers`** (a `TierSpec` per tier):\n\n" + tier_table())


def tier_table() -> str:
    from edge_rag.config import DEFAULT_TIERS

    rows = [f"| `{t.value}` | {s.k} | {s.context_chars} | {s.max_new_tokens} | {'yes' if s.rerank else 'no'} |"
            for t, s in DEFAULT_TIERS.items()]
    return "\n".join(["| tier | passages k | context chars | max new tokens | rerank |", "|---|---|---|---|---|"]
                     + rows) + "\n"


def fields_of(dotted: str) -> str:
    """The fields of the dataclass ``module.Class`` with their defaults and comments."""
    module_name, _, class_name = dotted.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    return _fields_table(cls, Path(sys.modules[module_name].__file__ or ""))


# -- the command line ----------------------------------------------------------------------------------------
def _subcommands(p: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    out = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]
    return out


def _option_rows(p: argparse.ArgumentParser) -> list[list[str]]:
    rows = []
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(a.option_strings) if a.option_strings else (a.metavar or a.dest)
        if a.option_strings and a.nargs != 0:
            name += " " + (a.metavar or a.dest.upper())
        default = "" if a.default in (None, False, [], argparse.SUPPRESS) or not a.option_strings else f"`{a.default}`"
        if a.required and a.option_strings:
            default = "required"
        choices = f"one of: {', '.join(map(str, a.choices))}" if a.choices else ""
        text = "; ".join(t for t in (a.help or "", choices) if t)
        if not text:
            raise GenerateError(f"{p.prog} {name}: no help text")
        rows.append([f"`{_cell(name)}`", _cell(default), _cell(text)])
    return rows


def cli_reference() -> str:
    from edge_rag.cli.commands import parser

    out = []

    def walk(p: argparse.ArgumentParser, helptext: str, depth: int) -> None:
        subs = _subcommands(p)
        if depth:
            if not helptext:
                raise GenerateError(f"{p.prog}: no help text")
            usage = " ".join(p.format_usage().removeprefix("usage: ").split())
            out.append(f"{'#' * min(depth + 1, 4)} `{p.prog}`\n\n{helptext[0].upper() + helptext[1:]}.\n\n"
                       f"```text\n{usage}\n```\n")
            rows = _option_rows(p)
            if rows and not subs:
                out.append("| option | default | meaning |\n|---|---|---|\n"
                           + "\n".join("| " + " | ".join(r) + " |" for r in rows) + "\n")
        for _, sub, h in subs:
            walk(sub, h, depth + 1)

    walk(parser(), "", 0)
    return "\n".join(out)


# -- the HTTP API --------------------------------------------------------------------------------------------
def _routes_of(path: Path) -> list[str]:
    """The reference's rows of the routes ``path`` registers, described by its module docstring."""
    rows: list[str] = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    described: dict[tuple[str, str], str] = {}
    key = None
    for line in (ast.get_docstring(tree) or "").splitlines():
        m = re.match(r"\s*(GET|POST|DELETE|PUT|PATCH)\s+(/\S*)\s+(.*)", line)
        if m:
            key = (m[1], m[2].split("?")[0])
            described[key] = m[3].strip()
        elif key and line.startswith("        ") and line.strip():  # the route's description goes on
            described[key] += " " + line.strip()
        else:
            key = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Route":
            route = node.args[0].value  # type: ignore[attr-defined]
            methods = ["GET"]
            for kw in node.keywords:
                if kw.arg == "methods":
                    methods = [e.value for e in kw.value.elts]  # type: ignore[attr-defined]
            shown = re.sub(r"\{(\w+)(?::\w+)?\}", r"{\1}", route)
            for method in methods:
                what = described.get((method, shown)) or described.get((method, shown.replace("doc_id", "id")
                                                                                  .replace("job_id", "id")))
                if not what:
                    raise GenerateError(f"{method} {route}: not described in the docstring of {path.relative_to(ROOT)}")
                rows.append(f"| `{method}` | `{shown}` | {_cell(what)} |")
    return rows


def http_routes() -> str:
    """The routes ``create_app`` registers, each described by its line of the module docstring of app.py (the
    operator page's: admin.py)."""
    rows = []
    for path in (ROOT / "edge_rag" / "serve" / "app.py", ROOT / "edge_rag" / "serve" / "admin.py"):
        rows += _routes_of(path)
    return "| method | path | what |\n|---|---|---|\n" + "\n".join(rows) + "\n"
