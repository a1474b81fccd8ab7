"""The documentation: the site builds strictly, the reference is generated from the code, every path it cites is in
the repository, and the README's example runs against the real API."""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLE_DOCS

README = ROOT / "README.md"
DOCS = ROOT / "docs"
CODE_DIRS = ("edge_rag", "convert", "benchmarks", "evaluation", "tests")
CODE_FILES = ("Makefile", "pyproject.toml", "mkdocs.yml", "docs/hooks.py", "docs/reference_gen.py")

# A path outside the repository, cited in prose: scripts and outputs nobody else has. The project's own locations
# under the home folder (the bundle cache, the token file, libpq's password file) are what a user types, so allowed.
OUTSIDE = re.compile(r"(?<![\w.:/-])(/(?:work|tmp|root|home|Users|mnt|scratch|var/tmp)/[^\s`)|]*)"
                     r"|(~/(?!\.cache/edge-rag|\.edge-rag-token|\.pgpass)[^\s`)|]+)")
UNCOMMITTED = re.compile(r"ad[- ]hoc|not committed", re.I)  # a figure whose script is not in the repository
IN_CODE = re.compile(r"/(?:work|root|home)/|ad[- ]hoc", re.I)  # code may use /tmp (temp dirs); nothing else outside
REPO_PATH = re.compile(r"(?<![\w./(-])((?:edge_rag|convert|benchmarks|evaluation|tests|docs)/[\w./*-]*[\w/*])")
DOCS_PAGE = re.compile(r"(?<![\w./-])(docs/[\w/-]+\.md)")
MODULE = re.compile(r"python -m ((?:edge_rag|convert|benchmarks|evaluation)(?:\.\w+)*)")
MAX_README_LINES = 250
# A command of ours the README, the docs or a shipped report shows (a line of a bash block, or an inline span, env
# first): only the repository's programs are parsed below, never pip or venv.
OURS = r"(?:python3? -m (?:edge_rag|convert|benchmarks|evaluation)\b|edge-rag )"
COMMAND = re.compile(rf"^(?:\w+=\S+ +)*({OURS}|python3? (?:tests|convert|benchmarks|evaluation)/[\w/]+\.py|make )")
MAKE_RUNS = re.compile(rf"(?<=bin/){OURS}.*")  # what a make target runs of ours (make test's runner takes pytest's)
# Runs each cited program's own argument parser on the cited words, in one process: the parser is taken at its first
# parse_args (nothing after it runs); a program reading sys.argv without one is not run at all.
PARSE = """
import argparse, contextlib, importlib.util, io, json, os, runpy, sys
class Parsed(Exception): pass
def take(self, args=None, namespace=None): raise Parsed(self)
def anything(convert):  # a <placeholder> stands for whatever value the reader fills in
    return lambda text: text if text == "PLACEHOLDER" else convert(text)
def actions(parser):
    for action in parser._actions:
        yield action
        for sub in action.choices.values() if isinstance(action.choices, dict) else ():  # sub-commands
            yield from actions(sub)
keep, errors, parsers = argparse.ArgumentParser.parse_known_args, [], {}
for where, module, argv, whole in json.loads(sys.stdin.read()):
    key = (module, argv[:1])
    if str(key) not in parsers:
        script = module.endswith(".py")  # python path/to/script.py
        spec = None if script else importlib.util.find_spec(module)
        spec = importlib.util.find_spec(module + ".__main__") if spec and spec.submodule_search_locations else spec
        origin = module if script else spec.origin if spec else ""
        source = open(origin, encoding="utf-8").read() if os.path.isfile(origin) else ""
        parsers[str(key)] = None
        if "parse_args" in source or "import main" in source:
            argparse.ArgumentParser.parse_known_args, sys.argv = take, [module, *argv[:1]]
            try:
                if script:
                    sys.path.insert(0, os.path.dirname(os.path.abspath(module)))
                    runpy.run_path(module, run_name="__main__")
                else:
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
            except Parsed as parsed:
                parsers[str(key)] = parsed.args[0]
                for action in actions(parsed.args[0]):
                    action.type = anything(action.type) if callable(action.type) else action.type
                    if isinstance(action.choices, (list, tuple)):
                        action.choices = [*action.choices, "PLACEHOLDER"]
            finally:
                argparse.ArgumentParser.parse_known_args = keep
    parser, said = parsers[str(key)], io.StringIO()
    if parser is None:
        errors += [f"{where}: {module} is no module with an argument parser to check {argv} against"] if argv else []
        continue
    named = [] if whole else [a for a in actions(parser) if a.required]  # a name: what it requires may be left out
    with contextlib.redirect_stderr(said):
        try:
            for action in named:
                action.required = False
            extra = [w for w in parser.parse_known_args(argv)[1] if w != "PLACEHOLDER"]  # or for several arguments
            if extra:
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
        except SystemExit:
            error = said.getvalue().strip().splitlines()[-1]
            if whole or "expected one argument" not in error:
                errors.append(f"{where}: {module} {' '.join(argv)}: {error}")
        finally:
            for action in named:
                action.required = True
print(json.dumps(errors))
"""


def _docs_text() -> list[tuple[Path, str]]:
    return [(p, p.read_text(encoding="utf-8")) for p in [README, *sorted(DOCS.rglob("*.md"))]]


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _where(path: Path, text: str, pos: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, pos) + 1}"


def test_docs_and_readme_cite_no_path_outside_the_repository():
    found = [f"{_where(p, t, m.start())}: {m[0]}" for p, t in _docs_text() for m in OUTSIDE.finditer(t)]
    found += [f"{_where(p, t, m.start())}: {m[0]!r} (a figure from a script not in the repository)"
              for p, t in _docs_text() for m in UNCOMMITTED.finditer(t)]
    assert not found, "paths outside the repository / uncommitted figures in the docs:\n" + "\n".join(found)


def test_code_cites_no_path_outside_the_repository():
    files = [p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py") if p != Path(__file__)]
    files += [ROOT / f for f in CODE_FILES]
    found = [f"{_where(p, t, m.start())}: {m[0]}" for p in files for t in [p.read_text(encoding="utf-8")]
             for m in IN_CODE.finditer(t)]
    assert not found, "paths outside the repository / ad-hoc figures in the code:\n" + "\n".join(found)


def test_every_repository_path_and_module_the_docs_cite_exists():
    missing = []
    for path, text in _docs_text():
        for m in REPO_PATH.finditer(text):
            cited = m[1].split("::")[0]
            if not any(ROOT.glob(cited)):
                missing.append(f"{_where(path, text, m.start())}: {cited}")
        for m in MODULE.finditer(text):
            module = ROOT / m[1].replace(".", "/")
            if not (module.with_suffix(".py").is_file() or (module / "__init__.py").is_file()):
                missing.append(f"{_where(path, text, m.start())}: python -m {m[1]}")
    for path in [p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py")]:  # code points into the docs too
        text = path.read_text(encoding="utf-8")
        missing += [f"{_where(path, text, m.start())}: {m[1]}" for m in DOCS_PAGE.finditer(text)
                    if not (ROOT / m[1]).is_file()]
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def _doc_commands() -> list[tuple[str, list[str], bool]]:
    """Every command the README, the docs and the shipped reports show: (where, its words, whether it is whole). A
    bash block's line, a ``python -m`` (the run behind a figure) and a ``make`` must run as written; an inline
    ``edge-rag X --option`` names the command or its option (the CLI reference has the rest), so what it names must
    exist but it may leave out what X requires."""
    found = []
    reports = sorted((ROOT / "edge_rag" / "assets").glob("*_report.md"))
    for path, text in _docs_text() + [(p, p.read_text(encoding="utf-8")) for p in reports]:
        spans = []
        for m in re.finditer(r"```bash\n(.*?)```", text, re.S):
            lines = m[1].replace("\\\n", "  ").split("\n")  # a continued line is one command, at its first line
            spans += [(m.start(1) + sum(len(s) + 1 for s in lines[:i]), line, True) for i, line in enumerate(lines)]
        prose = re.sub(r"```.*?```", lambda m: re.sub(r"[^\n]", " ", m[0]), text, flags=re.S)
        spans += [(m.start(), " ".join(m[1].split()), False) for m in re.finditer(r"`([^`]+)`", prose)
                  if "\n\n" not in m[1]]  # an inline span may wrap, within its paragraph
        for pos, span, block in spans:
            if (m := COMMAND.match(span.strip())):
                span = re.sub(r"\[(--[\w-]+)\]", r"\1", re.sub(r"<[^>]*>", "PLACEHOLDER", span.strip()[m.start(1):]))
                words = shlex.split(span, comments=True)
                cli = words[0] == "edge-rag" or words[2:3] == ["edge_rag"]
                found.append((_where(path, text, pos), words, block or not cli))
    return found


def _program(where: str, words: list[str], whole: bool) -> tuple[str, str, list[str], bool]:
    """(where, module or script, its arguments, whole) for ``python -m module ...``, ``python script.py ...`` or
    ``edge-rag ...``."""
    if "-m" in words[:2]:
        return where, words[words.index("-m") + 1], words[words.index("-m") + 2:], whole
    if words[0].endswith(("python", "python3")):
        return where, words[1], words[2:], whole
    return where, "edge_rag", words[1:], whole


@functools.cache
def _make_plan(*words: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-n", *words], cwd=ROOT, capture_output=True, text=True)


def _make_runs(where: str, words: list[str]) -> tuple[list[tuple[str, str, list[str], bool]], list[str]]:
    """What ``make`` runs of ours for these words (``make -n``: nothing is built), and an option a target sets that
    ARGS repeats (the target's own variable is the way: BENCH_OUT, not ARGS="--out DIR")."""
    targets = [w for w in words[1:] if "=" not in w and w not in ("make", "/")]
    assigned = [w for w in words[1:] if "=" in w and not w.endswith(("...", "…"))]  # ARGS=... stands for options
    plan = _make_plan(*targets, *assigned)
    if plan.returncode:
        return [], [f"{where}: {' '.join(words)}: {plan.stderr.strip()}"]
    runs, errors = [], []
    for line in (m[0] for m in MAKE_RUNS.finditer(plan.stdout)):
        run = shlex.split(line)
        options = [w.split("=")[0] for w in run if w.startswith("--")]
        errors += [f"{where}: {' '.join(words)} runs {line!r}: {o} twice (ARGS repeats what the target sets)"
                   for o in sorted(set(options)) if options.count(o) > 1]
        runs.append(_program(f"{where} (make: {line})", run, True))
    return runs, errors


def test_every_command_the_docs_show_runs_as_written():
    """Each program's own parser accepts the words the README, a docs page or a shipped report gives it (its module
    or sub-command, every option, the required ones in a whole command); a make target exists and what it runs
    passes the same check. Nothing is run: the parsers are taken at their parse_args."""
    checks, errors = [], []
    for where, words, whole in _doc_commands():
        if words[0] == "make":
            runs, bad = _make_runs(where, words)
            checks, errors = checks + runs, errors + bad
        else:
            checks.append(_program(where, words, whole))
    assert len(checks) > 100, len(checks)
    run = subprocess.run([sys.executable, "-W", "ignore::RuntimeWarning", "-c", PARSE], input=json.dumps(checks),
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    errors += json.loads(run.stdout.splitlines()[-1])
    assert not errors, "commands in the docs that cannot run as written:\n" + "\n".join(errors)


def test_the_targets_table_gives_the_figures_above_it():
    """docs/benchmarks/index.md's targets table states each status by "figures above": a re-measured figure left its
    old value there (35.5%, 14.8%, 73%, 269–290 MB, when the tables above said 35.3%, 11.5%, 74%, 266 MB). A figure
    marked ``before`` or ``~`` (an estimate) is history, not a status."""
    above, targets = (DOCS / "benchmarks" / "index.md").read_text(encoding="utf-8").split("## What the targets were")
    figure = re.compile(r"(?<![~\w.,])(\d+(?:\.\d+)?)(?:%| ms| MB)(?! before)|(?<![~\w.,])(\d+\.\d+)(?! before)")
    status = [row.split(" | ")[-1] for row in targets.splitlines() if row.startswith("| ")][2:]  # under the header
    shown = [a or b for cell in status for a, b in figure.findall(cell)]
    assert len(shown) > 5, shown
    missing = [f for f in shown if not re.search(rf"(?<![\d.,]){re.escape(f)}(?![\d,]|\.\d)", above)]
    assert not missing, f"the targets table gives figures the tables above do not: {missing}"


def test_a_figure_from_the_same_command_follows_one_command():
    """A table row whose command is "the same" takes the last command named above it, so that row must name one:
    docs/benchmarks/index.md's generated-answer latencies said "the same" under a row naming two commands, neither of
    which runs the `full` system they were measured on (rows had been inserted between them and their command)."""
    ambiguous = []
    for path, text in _docs_text():
        named: list[str] = []
        for m in re.finditer(r"^\|.*\|$", text, re.M):
            cell = m[0].strip("|").split(" | ")[-1]
            if cell.startswith("---"):  # a new table
                named = []
            elif cell.strip().startswith("the same"):
                ambiguous += [f"{_where(path, text, m.start())}: the same as {named}"] if len(named) != 1 else []
            elif (commands := re.findall(r"`((?:python -m|make) [^`]+)`", cell)):
                named = commands
    assert not ambiguous, "\n".join(ambiguous)


def test_readme_is_a_quick_start_whose_links_resolve():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES, "README.md is a quick start; the history is docs/decisions"
    links = [t for t in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in t]
    assert links and all((ROOT / t).exists() for t in links), [t for t in links if not (ROOT / t).exists()]


def test_config_reference_has_every_field_with_its_default_and_meaning():
    from edge_rag.config import Config

    table = _hooks().generate("config")
    rows = {r.split(" | ")[0].strip("| `"): r.split(" | ") for r in table.splitlines() if r.startswith("| `")}
    for f in dataclasses.fields(Config):
        assert f.name in rows, f"Config.{f.name} missing from the reference"
        default, meaning = rows[f.name][1].strip("`"), rows[f.name][-1].strip(" |")
        value = getattr(Config(), f.name)
        if f.name != "tiers":
            assert default == repr(getattr(value, "value", value)), (f.name, default)
        assert meaning, f"Config.{f.name} has no meaning in the reference"


def test_cli_and_http_reference_cover_every_command_and_route():
    from edge_rag.cli.commands import parser

    hooks = _hooks()
    cli = hooks.generate("cli")
    commands = [name for name, _, _ in hooks.ref._subcommands(parser())]
    assert commands and all(f"`edge-rag {c}`" in cli for c in commands)
    routes = hooks.generate("http")
    app = "".join((ROOT / "edge_rag" / "serve" / name).read_text(encoding="utf-8") for name in ("app.py", "admin.py"))
    for path in re.findall(r'Route\("([^"]+)"', app):
        shown = re.sub(r":\w+\}", "}", path)
        assert f"`{shown}`" in routes, path


def test_site_builds_strictly(tmp_path: Path):
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason="the docs extra is not installed (make install installs it)")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    config_page = (tmp_path / "site" / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    assert "max_error_rate" in config_page and "<!-- generate" not in config_page


def test_readme_python_example_runs(tmp_path: Path, bundle_dir: Path):
    """The README's Python example, as a user would run it: in a folder holding venue-docs/."""
    example = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert example, "README.md has no Python example"
    shutil.copytree(SAMPLE_DOCS, tmp_path / "venue-docs")
    run = subprocess.run([sys.executable, "-c", example[1]], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"^(RAG|GPT|REFUSE) ", run.stdout, re.M), run.stdout


def test_benchmark_pages_render_what_make_bench_wrote(tmp_path: Path):
    """A results file is shown under the page's own heading, its plots named (they are not in the site); a missing
    one is a note saying how to make it, never a typed table."""
    hooks = _hooks()
    hooks.BENCH_DIR = tmp_path
    assert "make bench" in hooks.generate("bench", "report.md") and "|" not in hooks.generate("bench", "report.md")
    (tmp_path / "report.md").write_text("# edge-rag benchmark\n\n## squad\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                                        "![route_mix](route_mix.png)\n", encoding="utf-8")
    (tmp_path / "load.json").write_text('{"routes": {"RAG": {"p50_ms": 86}}, "errors": 0}', encoding="utf-8")
    page = hooks.generate("bench", "report.md")
    assert page.startswith("### edge-rag benchmark") and "#### squad" in page and "| 1 | 2 |" in page
    assert "![" not in page and "route_mix.png" in page
    assert "| `routes.RAG.p50_ms` | 86 |" in hooks.generate("bench", "load.json")
