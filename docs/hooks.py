"""MkDocs hook: the reference pages and the result tables are written at build time from the code
(reference_gen.py) and from the files the repository's commands write, so they cannot drift from what they describe.

A page asks for a generated part with a marker on a line of its own:

    <!-- generate: config -->                  every Config field: default, allowed values, meaning
    <!-- generate: tiers -->                   the default tier budgets
    <!-- generate: fields MODULE.CLASS -->     every field of a dataclass (Answer, ServeConfig) with its comment
    <!-- generate: cli -->                     every edge-rag command, from its argparse parser
    <!-- generate: http -->                    every route of the HTTP API, from edge_rag/serve/app.py
    <!-- generate: include PATH -->            a results file of the repository (its headings two levels down)
    <!-- generate: bench FILE -->              bench-results/FILE as `make bench` wrote it, or how to make it

and inline, ``{{ config.FIELD }}`` is the default of that Config field (so "α = {{ config.max_error_rate }}" follows
the code). A field, route or command without a description is an error, so the strict build fails on it.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # this folder's reference_gen, whoever loads the hook
import reference_gen as ref  # noqa: E402
from reference_gen import ROOT, GenerateError, _cell  # noqa: E402

MARKER = re.compile(r"^<!-- generate: ([\w-]+)(?: (\S+))? -->$", re.M)
DEFAULT = re.compile(r"\{\{ config\.(\w+) \}\}")
BENCH_DIR = Path(os.environ.get("EDGE_RAG_BENCH_RESULTS", ROOT / "bench-results"))
MAX_INCLUDE_BYTES = 2_000_000  # a results file larger than this is not a page


def on_page_markdown(markdown: str, page, config, files) -> str:
    return DEFAULT.sub(lambda m: default_of(m[1]), MARKER.sub(lambda m: generate(m[1], m[2]), markdown))


def default_of(name: str) -> str:
    """The default of Config field ``name`` as a reader writes it (0.4, not 0.4000)."""
    _this_checkout()
    from edge_rag.config import Config

    if name not in Config.__dataclass_fields__:
        raise GenerateError(f"{{{{ config.{name} }}}}: Config has no field {name!r}")
    value = getattr(Config(), name)
    return f"{value:g}" if isinstance(value, float) else str(getattr(value, "value", value))


def generate(kind: str, arg: str | None = None) -> str:
    makers = {"config": ref.config_table, "tiers": ref.tier_table, "fields": ref.fields_of,
              "cli": ref.cli_reference, "http": ref.http_routes, "include": include, "bench": bench}
    if kind not in makers:
        raise GenerateError(f"unknown generated part {kind!r}: one of {', '.join(makers)}")
    _this_checkout()
    return makers[kind](arg) if arg else makers[kind]()


def _this_checkout() -> None:
    """Document this checkout's code, not an installed copy (mkdocs may have reset the path since import)."""
    if sys.path[0] != str(ROOT):
        sys.path.insert(0, str(ROOT))


# -- results files -------------------------------------------------------------------------------------------
def _read_bounded(path: Path) -> str:
    if path.stat().st_size > MAX_INCLUDE_BYTES:
        raise GenerateError(f"{path}: {path.stat().st_size} bytes, over the {MAX_INCLUDE_BYTES} a page may include")
    return path.read_text(encoding="utf-8")


def _embed(text: str, source: str) -> str:
    """A results file inside a page, under the page's own section: headings two levels down, plots named instead
    of linked (they are not in the site)."""
    text = re.sub(r"^(#{1,4}) ", r"##\1 ", text, flags=re.M)
    text = re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", lambda m: f"*(plot `{m[2]}` beside `{source}`)*", text)
    return text.strip() + "\n"


def include(relpath: str) -> str:
    path = ROOT / relpath
    if not path.is_file():
        raise GenerateError(f"{relpath}: no such file in the repository")
    return _embed(_read_bounded(path), relpath)


def bench(name: str) -> str:
    path = BENCH_DIR / name
    if not path.is_file():
        return (f"!!! note \"No `{name}` here yet\"\n    This table is rendered from `bench-results/{name}` when "
                "the site is built after `make bench` (it writes `bench-results/`). Run `make bench`, then "
                "`make docs`.\n")
    if path.suffix == ".json":
        return _json_table(json.loads(_read_bounded(path)), name)
    return _embed(_read_bounded(path), f"bench-results/{name}")


def _json_table(data: object, name: str) -> str:
    """A flat view of a JSON results file (the load test's): one row per leaf value."""
    rows: list[tuple[str, str]] = []

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                walk(f"{prefix}[{i}]", v)
        else:
            rows.append((prefix, json.dumps(value) if not isinstance(value, str) else value))

    walk("", data)
    return f"`bench-results/{name}`:\n\n| key | value |\n|---|---|\n" + "\n".join(
        f"| `{_cell(k)}` | {_cell(v)} |" for k, v in rows) + "\n"
