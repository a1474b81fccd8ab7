"""The house's layout: edge_rag is the device runtime only, no imports in the repository form a circle, edge_rag's
files stay small."""
from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "edge_rag"
PACKAGES = ("edge_rag", "convert", "benchmarks", "evaluation")  # every importable package of the repository
HOST_ONLY = ("convert", "benchmarks", "evaluation", "torch", "transformers")  # never on the device
MAX_LINES = 300  # one stage = one small module
# edge_rag's top level: the public API and the entry point; every other module sits in the package of its stage
TOP_LEVEL = {"__init__", "__main__", "config", "errors", "events", "pipeline", "types"}

IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
import edge_rag
after_import = sorted(sys.modules)
for m in pkgutil.walk_packages(edge_rag.__path__, "edge_rag."):
    if m.name != "edge_rag.__main__":
        importlib.import_module(m.name)
print(json.dumps({"import": after_import, "all": sorted(sys.modules)}))
"""


def _modules(packages: tuple[str, ...] = ("edge_rag",)) -> dict[str, Path]:
    """The modules of ``packages`` by dotted name."""
    out = {}
    for path in (p for package in packages for p in (ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports, at top level or inside functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}  # `from . import bundle` imports a module
    return found


def test_importing_edge_rag_loads_no_host_or_evaluation_module() -> None:
    """In a fresh process: `import edge_rag`, then every edge_rag module, pulls in nothing host-side
    (torch, transformers, convert, benchmarks, evaluation)."""
    out = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout)
    for key in ("import", "all"):
        host = [m for m in loaded[key] if m.split(".")[0] in HOST_ONLY]
        assert not host, (key, host)
        assert not [m for m in loaded[key] if m.startswith("edge_rag.") and m.rsplit(".", 1)[-1] in
                    ("datasets", "metrics", "budget")], key  # evaluation and harness code live elsewhere
    assert "edge_rag.pipeline" in loaded["all"] and "edge_rag.memory.plan" in loaded["all"]


IMPORT_HOST = """
import importlib, pkgutil
import benchmarks, convert, evaluation
for package in (benchmarks, convert, evaluation):
    for m in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
"""


def test_every_host_module_imports() -> None:
    """Every benchmark, convert and evaluation module imports (a fresh process): a name renamed in one module and
    still imported by a benchmark nobody ran for a while (benchmarks.backend_parity did) fails here, not for a user."""
    out = subprocess.run([sys.executable, "-c", IMPORT_HOST], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]


def test_no_edge_rag_source_imports_host_code() -> None:
    """Also lazily, inside functions: no edge_rag file names a host-side package."""
    bad = {name: sorted(m for m in _imports(name, path) if m.split(".")[0] in HOST_ONLY)
           for name, path in _modules().items()}
    assert not {k: v for k, v in bad.items() if v}


def import_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports. Every import statement counts: at module level, inside
    a function (a lazy import is still a dependency, and the usual way a circle gets hidden) and under
    TYPE_CHECKING. An edge from a module to its own enclosing package is left out: importing a child runs its
    parent's ``__init__`` first anyway, and an ``__init__`` that re-exports its children is not a circle."""
    modules = _modules(packages)
    return {name: {m for m in _imports(name, path) if m in modules and m != name and not name.startswith(m + ".")}
            for name, path in modules.items()}


def circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` as [a, b, ..., a], or [] if it has none (graphlib finds it)."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(reversed(exc.args[1]))  # graphlib lists it against the import direction
    return []


def test_circle_finds_an_import_circle() -> None:
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) in (["a", "b", "c", "a"], ["b", "c", "a", "b"],
                                                                         ["c", "a", "b", "c"])
    assert circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_imports_in_the_repository_form_a_circle() -> None:
    """Across edge_rag, convert, benchmarks and evaluation, function-level imports included."""
    graph = import_graph(PACKAGES)
    found = circle(graph)
    assert not found, "import circle: " + " -> ".join(found)
    assert "edge_rag.memory.plan" in graph["edge_rag.pipeline"] or "edge_rag.memory" in graph["edge_rag.pipeline"]
    assert "benchmarks.scale" in graph["benchmarks.run"]  # the graph holds the host packages' edges too


def test_no_edge_rag_file_is_long() -> None:
    lengths = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in _modules().values()}
    assert not {p: n for p, n in lengths.items() if n > MAX_LINES}, sorted(lengths.items(), key=lambda x: -x[1])[:5]


def test_edge_rag_is_grouped_by_stage() -> None:
    """A newcomer finds a module by its stage: no module at edge_rag's top level but the public API, and every
    package says in its docstring what it holds."""
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top <= TOP_LEVEL, sorted(top - TOP_LEVEL)
    packages = list(PACKAGE.rglob("__init__.py"))
    undocumented = [str(p.relative_to(ROOT)) for p in packages
                    if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]
    assert len(packages) > 8 and not undocumented, undocumented
