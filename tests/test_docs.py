"""The documentation: the site builds strictly, the reference is generated from the code, every path it cites is in
the repository, and the README's example runs against the real API."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
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
