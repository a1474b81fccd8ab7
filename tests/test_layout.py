"""The house's layout: edge_rag is the device runtime only, its imports form no circle, its files stay small."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "edge_rag"
HOST_ONLY = ("convert", "benchmarks", "evaluation", "torch", "transformers")  # never on the device
MAX_LINES = 300  # one stage = one small module

IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
import edge_rag
after_import = sorted(sys.modules)
for m in pkgutil.walk_packages(edge_rag.__path__, "edge_rag."):
    if m.name != "edge_rag.__main__":
        importlib.import_module(m.name)
print(json.dumps({"import": after_import, "all": sorted(sys.modules)}))
"""


def _modules() -> dict[str, Path]:
    """edge_rag's modules by dotted name."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
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


def test_edge_rag_imports_form_no_circle() -> None:
    modules = _modules()
    graph = {name: {m for m in _imports(name, path) if m in modules and m != name} for name, path in modules.items()}
    # a package's __init__ re-exports its children: an edge child -> its own parent package is not a cycle
    graph = {n: {m for m in deps if not n.startswith(m + ".")} for n, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            assert state.get(dep) != 1, " -> ".join(path + [node, dep])
            if dep not in state:
                visit(dep, path + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert "edge_rag.memory.plan" in graph["edge_rag.pipeline"] or "edge_rag.memory" in graph["edge_rag.pipeline"]


def test_no_edge_rag_file_is_long() -> None:
    lengths = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in _modules().values()}
    assert not {p: n for p, n in lengths.items() if n > MAX_LINES}, sorted(lengths.items(), key=lambda x: -x[1])[:5]
