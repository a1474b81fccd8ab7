"""PNG figures from results.json: stage latency, tokens, route mix, F1 against input tokens.

Uses matplotlib's object API (Figure, rendered by the Agg canvas): no pyplot, no global backend, no display.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

ROUTES = ("RAG", "GPT", "REFUSE")


def _systems(ds: dict) -> dict[str, dict]:
    return {k: v for k, v in ds.get("systems", {}).items() if "error" not in v}


def _figure(results: dict, path: Path, ylabel: str, draw: Callable[[Axes, dict[str, dict]], None]) -> Path | None:
    """One panel per dataset that has results, drawn by ``draw``."""
    datasets = {n: _systems(d) for n, d in results["datasets"].items() if _systems(d)}
    if not datasets:
        return None
    fig = Figure(figsize=(6.5 * len(datasets), 4.5))
    axes = fig.subplots(1, len(datasets), squeeze=False)
    for ax, (name, systems) in zip(axes[0], datasets.items()):
        draw(ax, systems)
        ax.set_title(name)
        ax.set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _stacked(ax: Axes, systems: dict[str, dict], parts: list[str], value: Callable[[dict, str], float]) -> np.ndarray:
    """Stacked bars, one per system; returns the totals."""
    names = list(systems)
    bottom = np.zeros(len(names))
    for part in parts:
        heights = np.array([value(systems[s], part) for s in names])
        ax.bar(names, heights, bottom=bottom, label=part)
        bottom += heights
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8)
    return bottom


def _latency(ax: Axes, systems: dict[str, dict]) -> None:
    stages = list(dict.fromkeys(st for s in systems.values() for st in s["stages_ms"]))
    totals = _stacked(ax, systems, stages, lambda s, st: s["stages_ms"].get(st, {}).get("mean_all", 0.0))
    for x, total in enumerate(totals):  # the RAG-route bars are too short to see: print every total
        ax.annotate(f"{total:,.0f}", (x, total), ha="center", va="bottom", fontsize=8)


def _routes(ax: Axes, systems: dict[str, dict]) -> None:
    _stacked(ax, systems, list(ROUTES), lambda s, r: s["route_mix"].get(r, 0.0))


def _tokens(ax: Axes, systems: dict[str, dict]) -> None:
    x = np.arange(len(systems))
    for offset, key in ((-0.2, "prompt_tokens"), (0.2, "completion_tokens")):
        ax.bar(x + offset, [s[key] or 0.0 for s in systems.values()], width=0.4, label=key.replace("_", " "))
    ax.set_xticks(x, list(systems), rotation=30)
    ax.legend(fontsize=8)


def _f1_tokens(ax: Axes, systems: dict[str, dict]) -> None:
    # a legend, not labels: points often coincide. Markers cycle: zip with 8 of them dropped the 9th system of a
    # full run, certified, the default
    for (name, s), marker in zip(systems.items(), itertools.cycle("osD^vP*Xh")):
        ax.scatter(s["prompt_tokens"] or 0.0, s["f1"] or 0.0, label=name, marker=marker, s=60, alpha=0.8)
    ax.set_xlabel("mean input (prompt) tokens")
    ax.legend(fontsize=8)


FIGURES = (  # file, y label, drawing
    ("latency_stages.png", "mean ms per question (stacked stages)", _latency),
    ("tokens.png", "mean tokens per question", _tokens),
    ("route_mix.png", "share of questions", _routes),
    ("f1_vs_tokens.png", "F1 (answerable)", _f1_tokens),
)


def write(results: dict, out: Path) -> list[Path]:
    return [p for name, label, draw in FIGURES if (p := _figure(results, out / name, label, draw))]
