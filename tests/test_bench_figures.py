"""The benchmark's figures computed as labelled: hand-made question rows through the harness's own summaries, and a
small run (one article's first paragraphs, the baseline and the default system) checked on invariants, never timings.

The rows are what ``benchmarks.run.ask_all`` writes to questions.jsonl.
"""
from __future__ import annotations

import gc
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from benchmarks import decision, peer, peer_worker, plots, routing, run, scale_backends
from benchmarks.systems import bench_config, preset, run_settings, settings_config
from edge_rag import EdgeRAG, Tier
from edge_rag.models.bundle import ROLE_GENERATOR, Bundle
from evaluation.metrics import best_f1


def _row(answerable: bool, candidate: str, score: float, answer: str | None, gold: list[str],
         threshold: float | None = 0.0) -> dict:
    """A questions.jsonl row: ``answer`` None when refused; ``f1`` is that of the answer given, as ask_all sets it;
    ``threshold`` that of the question's kind (None: its kind certifies nothing)."""
    return {"answerable": answerable, "candidate": candidate, "score": score, "answer": answer, "gold": gold,
            "f1": best_f1(answer, gold) if answerable else None, "score_threshold": threshold}


def test_risk_coverage_judges_each_candidate_by_its_own_answer():
    """A refused candidate that was right is a right answer on the curve (the curve answers it at a lower
    threshold): it once took the row's F1, 0 for every refusal, so a refused correct candidate counted as an error."""
    rows = [_row(True, "James Watt", 0.9, None, ["James Watt"]),  # right, refused by the system
            _row(True, "1712", 0.8, "1712", ["1712", "around 1712"]),  # right, answered
            _row(True, "steam", 0.7, None, ["internal combustion"]),  # wrong, refused
            _row(False, "Rankine", 0.6, None, [])]  # unanswerable: any answer is wrong
    assert decision.risk_coverage(rows) == [(0.25, 0.0), (0.5, 0.0), (0.75, 1 / 3), (1.0, 0.5)]
    answered = decision.error_among_answered(rows)  # the operating point: what the system said
    assert (answered["n_answered"], answered["n_errors"], answered["coverage"]) == (1, 0, 0.25)


def test_the_operating_point_is_on_its_risk_coverage_curve():
    """A question the decision refuses whatever its score (its kind certifies nothing) is never answered on the
    curve: counted as answered at the single-hop threshold, the curve held 435 answers at the system's threshold
    where the system gave 392 (SQuAD test split), its operating point off its own curve."""
    rows = [_row(True, "James Watt", 0.9, "James Watt", ["James Watt"], 0.5),  # single-hop, answered
            _row(True, "John Roebuck", 0.95, None, ["Matthew Boulton"], None),  # multi-hop, nothing certified
            _row(True, "1712", 0.7, "1712", ["1712"], 0.6),  # a kind of its own threshold, answered
            _row(False, "Rankine", 0.45, None, [], 0.5)]  # below its threshold: refused
    curve = decision.risk_coverage(rows)
    point = decision.error_among_answered(rows)
    assert (point["coverage"], point["error"]) in curve
    assert curve == [(0.25, 0.0), (0.5, 0.0), (0.75, 1 / 3)]  # the multi-hop question is never answered


def test_a_system_that_answers_nothing_is_named_on_the_risk_coverage_plot():
    """certified_rules certifies no threshold at alpha 0.4: its curve is empty, and the plot left it out unnamed, as
    if it had not run."""
    rows = [_row(True, "1712", 0.7, None, ["1712"], None)]
    curves = {"certified_rules": decision.risk_coverage(rows)}
    answered = {"certified_rules": decision.error_among_answered(rows)}
    from matplotlib.figure import Figure

    assert curves["certified_rules"] == []
    ax = Figure().subplots()
    decision.draw(ax, curves, answered, {"certified_rules": 0.4})
    assert ax.get_legend_handles_labels()[1] == ["certified_rules: answers no question at any threshold"]


def test_every_system_of_a_full_run_is_on_the_f1_against_tokens_plot():
    """A `make bench` runs all nine systems; the plot drew one per marker of eight, so the last, certified (the
    default), was missing from f1_vs_tokens.png."""
    from matplotlib.figure import Figure

    from benchmarks import plots
    from benchmarks.systems import SYSTEMS

    systems = {name: {"prompt_tokens": 10.0 * i, "f1": 0.1 * i} for i, name in enumerate(SYSTEMS)}
    ax = Figure().subplots()
    plots._f1_tokens(ax, systems)
    assert ax.get_legend_handles_labels()[1] == list(SYSTEMS) and len(SYSTEMS) > 8


@pytest.fixture(scope="module")
def small_run(bundle_dir: Path, squad_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """fixed_k (llama.cpp on every question) then certified (never generates) on 4 questions of a tiny SQuAD file."""
    tmp = tmp_path_factory.mktemp("bench")
    squad = json.loads(squad_path.read_text(encoding="utf-8"))
    squad["data"] = [{**squad["data"][0], "paragraphs": squad["data"][0]["paragraphs"][:3]}]
    (tmp / "squad.json").write_text(json.dumps(squad), encoding="utf-8")
    out = tmp / "out"
    with pytest.MonkeyPatch.context() as patch:  # observed, not changed: which pipelines are alive as a system starts
        patch.setattr(run, "run_system", _counting_pipelines(run.run_system))
        patch.setattr(run, "ask_all", _noting_what_is_loaded(run.ask_all))
        results = run.main(["--n", "4", "--datasets", "squad", "--squad", str(tmp / "squad.json"), "--bundle",
                            str(bundle_dir), "--out", str(out), "--index-cache", str(tmp / "index"), "--skip-peer",
                            "--skip-scale", "--threads", "1", "--part", "all", "--max-new-tokens", "6",
                            "--systems", "fixed_k,certified"])
    return results, out


PIPELINES_AT_START: list[int] = []  # live EdgeRAGs as each system of the small run started


def _counting_pipelines(run_system: Callable) -> Callable:
    def counted(*args, **kwargs):
        gc.collect()
        PIPELINES_AT_START.append(sum(isinstance(o, EdgeRAG) for o in gc.get_objects()))
        return run_system(*args, **kwargs)
    return counted


LOADED_AT_FIRST_QUESTION: dict[str, tuple[bool, bool]] = {}  # per system: (neural reader, llama.cpp) as needed


def _noting_what_is_loaded(ask_all: Callable) -> Callable:
    def noted(rag: EdgeRAG, *args, **kwargs):
        LOADED_AT_FIRST_QUESTION[args[-1]] = (not rag.config.reads_neural or rag.certified._neural is not None,
                                              not rag.certified.may_generate or rag._generator is not None)
        return ask_all(rag, *args, **kwargs)
    return noted


def test_every_system_is_warm_at_its_first_measured_question(small_run):
    """Warm-up is excluded alike for every system: the warm-up question is refused out of domain before it is
    read, so certified's first measured question loaded the neural reader (569 ms against a median of 91 on SQuAD's
    test split)."""
    assert LOADED_AT_FIRST_QUESTION == {"squad/fixed_k": (True, True), "squad/certified": (True, True)}


def test_no_other_pipeline_is_alive_while_a_system_runs(small_run):
    """A system's memory figures are its own only if nothing else is held: the pipeline that measured the corpus's
    retrieval stayed alive through every system (its sessions: +35 MB in certified's peak RSS on SQuAD's test split)."""
    assert PIPELINES_AT_START == [0, 0]


def test_peak_rss_is_each_systems_own(small_run, bundle_dir: Path):
    """A system that never loads llama.cpp peaks below the baseline that generated every answer, by at least half the
    GGUF (whose weights every generation reads): it once showed the process's peak so far, the baseline's model
    included (601 MB for certified after fixed_k, 229 MB run alone)."""
    results, _ = small_run
    systems = results["datasets"]["squad"]["systems"]
    gguf_mb = Bundle.load(bundle_dir).require(ROLE_GENERATOR).stat().st_size / 2**20
    assert systems["fixed_k"]["route_mix"].get("GPT", 0) + systems["fixed_k"]["route_mix"].get("REFUSE", 0) == 1
    assert systems["certified"]["completion_tokens"] == 0
    assert systems["certified"]["process_peak_rss_mb"] < systems["fixed_k"]["process_peak_rss_mb"] - gguf_mb / 2
    assert systems["certified"]["rss_mb"] < systems["fixed_k"]["rss_mb"] - gguf_mb / 2


def test_the_report_quotes_no_p95_of_four_questions(small_run):
    """The small run asks 4 questions: each system's p95 (end to end and per stage) is '–' in report.md as in
    results.json, where it was the largest of the 4 or near it."""
    results, out = small_run
    report = (out / "report.md").read_text(encoding="utf-8").splitlines()
    for name, s in results["datasets"]["squad"]["systems"].items():
        assert (s["latency_ms"]["n"], s["latency_ms"]["p95"]) == (4, None)
        assert all(x["p95"] is None for x in s["stages_ms"].values())
        headline = next(line for line in report if re.match(rf"\| (\*\*)?{name}(\*\*)? \| [0-9–]", line))
        assert headline.split(" | ")[7] == "–"  # the p95 ms column


def test_ood_refusal_is_reported_only_where_measured(small_run):
    """OOD-test questions are only decided, so a system without a decision has no OOD figure: it once showed 0%
    refused, though such a system refuses an answer cut off before its first sentence."""
    results, out = small_run
    systems = results["datasets"]["squad"]["systems"]
    assert systems["fixed_k"]["ood"] == {"n": 0, "refused": None, "p50_ms": None}
    assert systems["certified"]["ood"]["n"] == 4 and 0 <= systems["certified"]["ood"]["refused"] <= 1
    table = (out / "report.md").read_text(encoding="utf-8").split("### Decision layer")[1]
    fixed_k = next(line.split(" | ") for line in table.splitlines() if line.startswith("| fixed_k |"))
    assert fixed_k[4] == "–"  # the OOD-test refused column


def test_the_routers_table_is_of_a_routed_system_that_ran(small_run):
    """The default system routes every question by the router too: a run of it without `full` (as `--systems
    certified`) reported "No routed system ran" under tier choices the router had made."""
    results, out = small_run
    router = results["datasets"]["squad"]["router"]
    rows = [json.loads(line) for line in (out / "questions.jsonl").read_text(encoding="utf-8").splitlines()]
    answerable = [r for r in rows if r["system"] == "certified" and r["answerable"]]
    assert router["system"] == "certified" and router["answerable"] == len(answerable) > 0
    assert sum(map(sum, router["confusion"])) == router["labelled"] <= len(answerable)
    table = (out / "report.md").read_text(encoding="utf-8").split("### Router")[1].split("###")[0]
    assert "Router tiers of `certified`" in table and "No routed system ran" not in table


def test_an_interrupted_run_leaves_the_last_complete_one_whole(small_run, bundle_dir: Path, tmp_path: Path):
    """A run into a folder holding a complete one, stopped after its first dataset (here: the second dataset's file
    does not parse), leaves that folder's questions.jsonl, results.json and report.md as they were, and its own rows
    aside: questions.jsonl was emptied at the start, then held the stopped run's rows beside the old results."""
    _, done = small_run
    out = shutil.copytree(done, tmp_path / "out")
    before = {name: (out / name).read_bytes() for name in ("questions.jsonl", "results.json", "report.md")}
    (tmp_path / "broken.jsonl").write_text("{not json\n", encoding="utf-8")
    with pytest.raises(ValueError):
        run.main(["--n", "4", "--datasets", "squad,hotpotqa", "--squad", str(done.parent / "squad.json"), "--hotpot",
                  str(tmp_path / "broken.jsonl"), "--bundle", str(bundle_dir), "--out", str(out), "--index-cache",
                  str(done.parent / "index"), "--skip-peer", "--skip-scale", "--threads", "1", "--part", "all",
                  "--systems", "certified"])
    assert {name: (out / name).read_bytes() for name in before} == before
    rows = [json.loads(line) for line in (out / "questions.jsonl.partial").read_text(encoding="utf-8").splitlines()]
    assert [(r["dataset"], r["system"]) for r in rows] == [("squad", "certified")] * 4


def test_a_run_stopped_while_its_figures_are_drawn_leaves_the_last_complete_one_whole(small_run, bundle_dir: Path,
                                                                                     tmp_path: Path):
    """Ctrl-C while the figures were drawn (the run's last seconds) left this run's results.json and questions.jsonl
    beside the last run's report.md and figures. They are drawn aside now and moved in together, the report last; a
    Ctrl-C while they are moved in waits until all are."""
    _, done = small_run
    out = shutil.copytree(done, tmp_path / "out")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    argv = ["--n", "1", "--datasets", "squad", "--squad", str(done.parent / "squad.json"), "--bundle", str(bundle_dir),
            "--out", str(out), "--index-cache", str(done.parent / "index"), "--skip-peer", "--skip-scale",
            "--threads", "1", "--part", "all", "--systems", "certified"]

    def stopped(results: dict, folder: Path) -> list[Path]:
        draw(results, folder)
        raise KeyboardInterrupt  # as Ctrl-C once these are drawn, before the risk-coverage plots and the report

    def interrupted(*args, **kwargs) -> None:  # Ctrl-C while the outputs are moved in
        os.kill(os.getpid(), signal.SIGINT)
        drop(*args, **kwargs)

    draw, drop = plots.write, run.drop_stale
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "write", stopped)
        with pytest.raises(KeyboardInterrupt):
            run.main(argv)
    assert {name: (out / name).read_bytes() for name in before} == before
    # a shell starts a background job (CI's) with SIGINT ignored, and Python keeps that: Ctrl-C's usual handler here
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(run, "drop_stale", interrupted)
            with pytest.raises(KeyboardInterrupt):
                run.main(argv)
    finally:
        signal.signal(signal.SIGINT, ignored)
    created = json.loads((out / "results.json").read_text(encoding="utf-8"))["created"]
    assert created in (out / "report.md").read_text(encoding="utf-8") and not (out / run.STAGE).exists()
    assert len((out / "questions.jsonl").read_text(encoding="utf-8").splitlines()) == 1


@pytest.mark.parametrize("n", ["0", "-1"])
def test_no_questions_is_refused_before_the_run(n: str, capsys):
    """--n 0 once ran every system on no question and then failed writing report.md; --n -1 failed sampling."""
    with pytest.raises(SystemExit):
        run.parse_args([f"--n={n}"])
    assert "at least 1 question" in capsys.readouterr().err


def test_make_bench_writes_every_file_into_one_folder(tmp_path: Path):
    """The site renders one folder (EDGE_RAG_BENCH_RESULTS): the report, load.json and own_calibration must all be in
    it. With the folder given through ARGS="--out DIR", the load test and own_calibration still wrote bench-results/."""
    plan = subprocess.run(["make", "-n", "bench", f"BENCH_OUT={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    runs = [line for line in plan.splitlines() if " -m benchmarks" in line]
    assert len(runs) == 3 and all(f"--out {tmp_path}" in line for line in runs), runs


def test_router_labels_that_do_not_fit_the_budget_are_reported_not_raised(small_run, bundle_dir: Path):
    """The router's labels open three pipelines at once: under a --memory-mb the systems fit one by one they may not
    fit, and the BudgetError ended the whole run after every system had been measured (700 MB, routing alone)."""
    results, _ = small_run
    db = Path(results["datasets"]["squad"]["corpus"]["db"])
    out = routing.router_confusion(db, bundle_dir, bench_config(memory_mb=100), [], {"routing": []})
    assert out is not None and out["system"] == "routing" and "memory_budget_mb" in out["error"]
    assert routing.report(out).startswith("No tier labels for `routing`: ")


def test_the_peer_stacks_answer_with_the_runs_settings():
    """The peer comparison's edge-rag stacks run in worker processes that build their Config from job.json: they
    answered with sentence passages, the tiers' own answer lengths and context budgets whatever the run was given."""
    args = run.parse_args(["--passages", "paragraph", "--max-new-tokens", "6", "--context-chars", "EASY=300",
                           "--threads", "1", "--memory-mb", "900"])
    job = json.loads(json.dumps({"config": run_settings(args)}))  # as the worker reads it
    expected = bench_config(1, 900, "paragraph", 6, {Tier.EASY: 300})
    assert preset(settings_config(job["config"]), "fixed_k") == preset(expected, "fixed_k")
    assert expected.passage_mode == "paragraph" and expected.tier(Tier.EASY).context_chars == 300


def test_each_peer_stack_loads_at_start_what_it_may_use(bundle_dir: Path, sample_db: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    """The peer loads llama.cpp before its first answer; edge-rag's stacks loaded it at their first generated answer,
    so full_cgr, none of whose 11 questions was generated for, was measured without it (peak RSS 119 MB, where
    `edge-rag serve` with its decision holds 442 MB), and a warm answer that generated would have paid its load. Each
    stack now loads at start what it may use (EdgeRAG.warm_up), as the served kiosk does: llama.cpp for full_cgr,
    nothing more for certified, which never generates."""
    import llama_cpp

    loaded: list[str] = []
    load = llama_cpp.Llama.__init__

    def observed(self, *args, **kwargs) -> None:  # observed, not changed
        loaded.append(kwargs["model_path"])
        load(self, *args, **kwargs)

    monkeypatch.setattr(llama_cpp.Llama, "__init__", observed)
    shutil.copytree(sample_db, tmp_path / "db")
    job = {"db": str(tmp_path / "db"), "bundle": str(bundle_dir),
           "config": run_settings(run.parse_args(["--threads", "1"]))}
    peer_worker.edge_answerer("full_cgr", job)  # no question asked yet
    assert loaded == [str(Bundle.load(bundle_dir).require(ROLE_GENERATOR))]
    peer_worker.edge_answerer("certified", job)
    assert len(loaded) == 1


def test_a_reused_folder_keeps_only_this_runs_figures_and_peer_files(small_run, bundle_dir: Path, tmp_path: Path):
    """A run into a folder an earlier run wrote left that run's figures and peer files beside its own (a
    risk-coverage plot of a dataset this run did not measure, the peer's results under --skip-peer)."""
    _, done = small_run
    out = shutil.copytree(done, tmp_path / "out")
    (out / "risk_coverage_hotpotqa.png").write_bytes(b"an earlier run's plot")
    (out / "peer").mkdir()
    (out / "peer" / "edge_rag-fixed_k.json").write_text("{}", encoding="utf-8")
    (out / scale_backends.ROWS_FILE).write_text('{"n": 10000, "backend": "embedded"}\n', encoding="utf-8")
    run.main(["--n", "4", "--datasets", "squad", "--squad", str(done.parent / "squad.json"), "--bundle",
              str(bundle_dir), "--out", str(out), "--index-cache", str(done.parent / "index"), "--skip-peer",
              "--skip-scale", "--threads", "1", "--part", "all", "--systems", "certified"])
    linked = set(re.findall(r"!\[[^]]*\]\(([^)]+)\)", (out / "report.md").read_text(encoding="utf-8")))
    assert {p.name for p in out.glob("*.png")} == linked and "risk_coverage_squad.png" in linked
    assert not (out / "peer").exists() and not (out / scale_backends.ROWS_FILE).exists()


def test_the_store_scale_rows_are_this_runs_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Each row of the store comparison is appended to OUT/scale_stores.jsonl as it is measured (a stopped run's
    survive); the file was never emptied, so a second run into the folder left 8 rows of two runs (10k: 4 each)."""
    (tmp_path / scale_backends.ROWS_FILE).write_text('{"n": 10000, "backend": "embedded"}\n', encoding="utf-8")
    monkeypatch.setenv("EDGE_RAG_PG_URL", "postgresql://unused")  # no server started; no size, so no connection
    vectors = np.eye(4, dtype=np.float32)
    scale_backends.run(vectors, vectors, [["t", "x"]] * 4, ["q"] * 4, [], bench_config(1), tmp_path, 0)
    assert not (tmp_path / scale_backends.ROWS_FILE).exists()


def test_a_stopped_peer_comparison_leaves_the_last_complete_runs_peer_files(small_run, bundle_dir: Path,
                                                                            tmp_path: Path):
    """Ctrl-C during the peer comparison left the stopped run's job.json, passages.json and the stacks it had measured
    in OUT/peer, beside the earlier run's other stacks and its results.json: two runs' figures in one folder."""
    _, done = small_run
    out = shutil.copytree(done, tmp_path / "out")
    (out / "peer").mkdir()
    earlier = {"job.json": '{"questions": ["an earlier run"]}', "peer.json": '{"p50_ms": 1.0}'}
    for name, text in earlier.items():
        (out / "peer" / name).write_text(text, encoding="utf-8")

    def stopped(work: Path, *argv: str) -> dict:
        raise KeyboardInterrupt  # as Ctrl-C while the peer's index builds

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(peer, "_worker", stopped)
        try:
            run.main(["--n", "2", "--datasets", "squad", "--squad", str(done.parent / "squad.json"), "--bundle",
                      str(bundle_dir), "--out", str(out), "--index-cache", str(done.parent / "index"),
                      "--skip-scale", "--threads", "1", "--part", "all", "--systems", "certified"])
        except KeyboardInterrupt:
            pass
        else:
            pytest.skip("the peer comparison is not installed here (sentence-transformers, faiss, MiniLM)")
    assert {p.name: p.read_text(encoding="utf-8") for p in (out / "peer").iterdir()} == earlier


def test_the_peer_workers_find_their_folder_from_any_directory(small_run, bundle_dir: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch):
    """`python -m benchmarks --out results` from outside the repository: the peer's workers run from the repository's
    root and looked for results/peer.partial/job.json there ("Peer index build failed: FileNotFoundError")."""
    results, _ = small_run
    monkeypatch.chdir(tmp_path)
    work = Path("out") / peer.WORK
    work.mkdir(parents=True)
    job = {"questions": ["Who ruled the duchy of Normandy?"], "db": results["datasets"]["squad"]["corpus"]["db"],
           "bundle": str(bundle_dir), "config": run_settings(run.parse_args(["--threads", "1"]))}
    (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
    answered = peer._worker(work, "serve", "edge_rag:certified", "0")
    assert "error" not in answered and sum(answered["routes"].values()) == 1
