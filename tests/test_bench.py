"""The benchmark harness: metric functions against hand-computed cases, and a tiny end-to-end run.

The tiny run uses a few paragraphs of the real QA files (so the index builds in seconds) and two
questions per dataset; it checks the shape of what `python -m benchmarks` writes, never timings.
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks import data, run
from benchmarks import metrics as M
from benchmarks.systems import BASELINE, SYSTEMS, available, bench_config, preset
from edge_rag.config import Tier
from evaluation.datasets import QAItem


def test_em_f1_use_squad_normalisation():
    assert M.best_em("The Eiffel Tower!", ["eiffel tower"]) == 1.0
    assert M.best_em(None, ["Paris"]) == 0.0  # a refusal scores 0 on an answerable question
    # "in paris france" vs "paris": precision 1/3 ("in" and "france" are extra), recall 1 -> F1 0.5
    assert M.best_f1("in Paris, France", ["Paris"]) == pytest.approx(0.5)
    assert M.best_f1("Paris", ["Lyon", "paris"]) == 1.0  # best gold wins


def test_ranking_metrics_by_hand():
    ranked = ["x", "g1", "x", "g1", "g2", "y"]  # documents of the ranked passages
    gold = frozenset({"g1", "g2"})
    assert M.reciprocal_rank(ranked, gold) == 0.5
    assert M.reciprocal_rank(["x", "y"], gold) == 0.0
    assert M.recall_at_k(ranked, gold, 2) == 0.5
    assert M.recall_at_k(ranked, gold, 5) == 1.0
    assert M.precision_at_k(ranked, gold, 5) == pytest.approx(3 / 5)
    assert M.context_precision(["g1", "x", "x", "g2"], gold) == 0.5
    assert M.context_precision([], gold) is None
    assert M.context_recall(["g1", "g1", "x"], gold) == 0.5


def test_faithfulness_and_relevance():
    assert M.faithfulness("the Treaty of Rome", "The Treaty of Rome was signed in 1957.") == 1.0
    assert M.faithfulness("Rome 1958", "The Treaty of Rome was signed in 1957.") == 0.5
    assert M.faithfulness(None, "anything") is None
    assert M.cosine(np.array([1.0, 0.0]), np.array([1.0, 1.0])) == pytest.approx(2 ** -0.5)


def test_no_p95_is_quoted_from_fewer_than_20_samples():
    """A p95 of 6 latencies is the 6th's neighbourhood (the report quoted 2,444 ms as fixed_k's p95 of 6 questions,
    and p95s of a stage that ran on 2): under 20 samples it is None, beside the sample's size."""
    short = M.percentiles([float(x) for x in range(1, 20)])
    assert short == {"p50": 10.0, "p95": None, "mean": 10.0, "n": 19}
    assert M.percentiles([float(x) for x in range(20)])["p95"] == pytest.approx(18.05)  # numpy's linear method
    assert M.percentiles([]) == {"p50": None, "p95": None, "mean": None, "n": 0}


def test_bootstrap_ci_contains_true_delta():
    rng = np.random.default_rng(1)
    base = rng.uniform(0, 1, 400)
    system = base + 0.1 + rng.normal(0, 0.05, 400)  # true paired delta 0.1
    ci = M.bootstrap_ci(system - base, seed=0)
    assert ci["lo"] < 0.1 < ci["hi"] and ci["hi"] - ci["lo"] < 0.05 and ci["n"] == 400
    assert M.bootstrap_ci([0.2] * 10) == {"mean": 0.2, "lo": pytest.approx(0.2), "hi": pytest.approx(0.2), "n": 10}
    assert M.bootstrap_ci([])["mean"] is None


def test_sample_mixes_answerable_and_unanswerable():
    items = [QAItem(str(i), f"q{i}", [] if i % 3 else ["a"], "squad", is_impossible=bool(i % 3)) for i in range(30)]
    picked = data.sample(items, 8, seed=0)
    assert len(picked) == 8 and sum(q.is_impossible for q in picked) == 4
    assert picked == data.sample(items, 8, seed=0)
    assert [q.id for q in picked] == sorted((q.id for q in picked), key=int)  # file order
    assert len(data.sample(items, None, seed=0)) == 30


def test_presets_switch_stages():
    base = bench_config()
    assert base.temperature == 0.0
    assert preset(base, "gpt_only").retrieval == "none"
    fixed = preset(base, "fixed_k")
    assert not (fixed.router or fixed.rerank or fixed.compression or fixed.correction or fixed.cgr)
    assert preset(base, "full_cgr").cgr and not preset(base, "full").cgr
    alone = preset(base, "compression")  # compression measured without the router (issue #16)
    assert alone.compression and not (alone.router or alone.rerank or alone.correction or alone.cgr)


# Answers in the tiny run: long enough for the short answers to be generated whole, and a longer one is cut off and
# refused as such (the test below checks both kinds), at a fraction of the tiers' own 64-128 tokens.
TINY_MAX_NEW_TOKENS = 6


@pytest.fixture(scope="module")
def tiny_run(bundle_dir: Path, squad_path: Path, hotpot_path: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("bench")
    squad = json.loads(squad_path.read_text(encoding="utf-8"))
    squad["data"] = [{**squad["data"][0], "paragraphs": squad["data"][0]["paragraphs"][:3]}]
    (tmp / "squad.json").write_text(json.dumps(squad), encoding="utf-8")
    (tmp / "hotpot.jsonl").write_text("\n".join(hotpot_path.read_text(encoding="utf-8").splitlines()[:2]) + "\n")
    here = Path.cwd()
    os.chdir(tmp)  # paths relative to where the user runs it, as a user types them
    try:
        results = run.main(["--n", "2", "--squad", "squad.json", "--hotpot", "hotpot.jsonl", "--bundle",
                            str(bundle_dir), "--out", "out", "--index-cache", "index", "--skip-peer", "--scale-sizes",
                            "300", "--threads", "1", "--part", "all", "--max-new-tokens", str(TINY_MAX_NEW_TOKENS)])
    finally:
        os.chdir(here)
    return results, tmp / "out"


def test_tiny_run_writes_every_output(tiny_run):
    results, out = tiny_run
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["schema_version"] == run.SCHEMA_VERSION == results["schema_version"]
    assert {"created", "args", "hardware", "systems", "baseline", "datasets", "peer", "scale", "runtime_s"} <= set(on_disk)
    assert on_disk["hardware"]["versions"]["numpy"] and on_disk["hardware"]["bundle"]["files"]
    for name in ("squad", "hotpotqa"):
        ds = on_disk["datasets"][name]
        assert ds["n_questions"] == 2 and ds["part"] == "all" and {"recall@5", "recall@10", "precision@5", "mrr@10"} <= set(ds["retrieval"])
        assert set(ds["systems"]) == set(available())
        for system, s in ds["systems"].items():
            assert "error" not in s, (name, system, s)
            assert {"em", "f1", "prompt_tokens", "completion_tokens", "latency_ms", "stages_ms", "route_mix",
                    "refuse_answerable", "refuse_unanswerable", "faithfulness", "relevance"} <= set(s)
            assert abs(sum(s["route_mix"].values()) - 1) < 1e-9
            assert ("vs_baseline" in s) and {"speedup", "token_reduction", "f1_delta", "token_delta"} <= set(
                s["vs_baseline"])
    assert on_disk["datasets"]["squad"]["n_answerable"] == 1  # the seeded mix: one of each kind
    oods = [s["ood"] for s in on_disk["datasets"]["squad"]["systems"].values() if s["ood"]["n"]]
    assert oods and all(o["n"] == 2 and 0 <= o["refused"] <= 1 and o["p50_ms"] > 0 for o in oods)
    assert on_disk["peer"] == {"skipped": "--skip-peer"}
    assert [r["n"] for r in on_disk["scale"]["rows"]] == [300]
    rows = (out / "questions.jsonl").read_text().splitlines()
    assert len(rows) == 2 * 2 * len(available())
    report = (out / "report.md").read_text()
    assert "## squad" in report and "## Retrieval" in report and "## Hardware" in report
    assert {p.name for p in out.glob("*.png")} >= {"latency_stages.png", "tokens.png", "route_mix.png",
                                                   "f1_vs_tokens.png"}
    assert "### Decision layer" in report and "OOD-test decide p50 ms" in report
    assert "### Router: tier choices against tier labels" in report
    for ds in on_disk["datasets"].values():  # the router's confusion on the run's answerable questions
        r = ds["router"]
        assert r["system"] == "full" and len(r["confusion"]) == 3 and all(len(row) == 3 for row in r["confusion"])
        assert sum(map(sum, r["confusion"])) == r["labelled"] <= r["answerable"] <= ds["n_answerable"]


def test_tiny_run_measures_what_each_system_does(tiny_run):
    """The numbers follow from the systems' definitions: GPT-only retrieves nothing, systems without
    confidence-gated routing always generate, the baseline compared with itself changes nothing, and each
    row's F1 is the metric of its own answer."""
    from evaluation.metrics import best_f1

    _, out = tiny_run
    on_disk = json.loads((out / "results.json").read_text())
    rows = [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]
    for name, ds in on_disk["datasets"].items():
        systems = ds["systems"]
        assert systems["gpt_only"]["context_chars"] == 0 and systems["fixed_k"]["context_chars"] > 0
        assert systems["gpt_only"]["prompt_tokens"] < systems["fixed_k"]["prompt_tokens"]
        budget = bench_config().tier(bench_config().fallback_tier).context_chars  # no router: the fallback's
        assert [r["context_chars"] <= budget for r in rows if r["system"] == "compression"] == [True] * 4
        for system, s in systems.items():
            if not SYSTEMS[system].get("cgr", True):  # always generates; an answer cut before its first sentence is refused
                assert set(s["route_mix"]) <= {"GPT", "REFUSE"}, (name, system)
    for r in rows:
        if not SYSTEMS[r["system"]].get("cgr", True) and r["route"] == "REFUSE":
            assert "cut off" in r["refusal_reason"], r
        itself = systems[BASELINE]["vs_baseline"]  # the baseline's rows against themselves
        assert itself["token_reduction"] == 0 and itself["token_delta"]["mean"] == 0
        assert itself["f1_delta"]["mean"] in (0.0, None)
    for r in rows:
        if r["system"] == "gpt_only":
            assert r["n_passages"] == 0 and r["context_chars"] == 0
        if r["answerable"]:
            assert r["f1"] == best_f1(r["answer"], r["gold"])
        assert r["route"] == "GPT" or r["completion_tokens"] == 0 or "cut off" in (r["refusal_reason"] or "")
        assert r["completion_tokens"] <= TINY_MAX_NEW_TOKENS  # --max-new-tokens reached every system's tiers


def test_benchmark_part_is_the_test_split(squad_path: Path):
    from benchmarks.splits import SPLITS_FILE
    from evaluation.datasets import load_squad

    docs, items = load_squad(squad_path)
    held = data.held_out(items)
    test_articles = json.loads(SPLITS_FILE.read_text(encoding="utf-8"))["squad"]["test"]
    assert held and {q.group for q in held} == {a.replace("_", " ") for a in test_articles}  # one split for all
    ds = data.load("squad", squad_path, 40, seed=0)
    assert ds.part == "benchmark" and len(ds.items) == 40 and {q.id for q in ds.items} <= {q.id for q in held}
    assert len(ds.documents) == len(docs)  # the corpus stays open: every context of the file
    assert data.load("squad", squad_path, 40, seed=0, part="all").part == "all"
    answerable = data.load("squad", squad_path, None, seed=0, answerable=True)  # --answerable: F1 runs
    assert answerable.items and all(not q.is_impossible for q in answerable.items)
    assert {q.id for q in answerable.items} == {q.id for q in held if not q.is_impossible}
    val = data.load("squad", squad_path, None, seed=0, part="val")
    assert val.part == "val" and {q.group for q in val.items} == {"Imperialism"}


def test_passage_unit_reaches_the_config():
    assert run.parse_args([]).passages == "sentence"
    args = run.parse_args(["--passages", "paragraph"])
    assert bench_config(passage_mode=args.passages).passage_mode == "paragraph"
    with pytest.raises(SystemExit):
        run.parse_args(["--passages", "page"])


def test_max_new_tokens_caps_every_tier():
    """--max-new-tokens lowers each tier's answer budget to at most N and leaves everything else as it was."""
    args = run.parse_args(["--max-new-tokens", "12"])
    capped, default = bench_config(max_new_tokens=args.max_new_tokens), bench_config()
    assert run.parse_args([]).max_new_tokens is None
    assert [s.max_new_tokens for s in capped.tiers.values()] == [12] * len(capped.tiers)
    assert [replace(s, max_new_tokens=1) for s in capped.tiers.values()] == [
        replace(s, max_new_tokens=1) for s in default.tiers.values()]
    assert capped.with_(tiers=default.tiers) == default
    assert bench_config(max_new_tokens=100).tier(Tier.EASY).max_new_tokens == default.tier(Tier.EASY).max_new_tokens
    for bad in ("0", "-3", "ten"):
        with pytest.raises(SystemExit):
            run.parse_args(["--max-new-tokens", bad])


def test_context_chars_set_the_named_tiers_only():
    """--context-chars TIER=N (repeatable) sets those tiers' context budgets and nothing else; bad values are refused
    with TierSpec's own message."""
    args = run.parse_args(["--context-chars", "hard=600", "--context-chars", "MEDIUM=400"])
    assert args.context_chars == [(Tier.HARD, 600), (Tier.MEDIUM, 400)] and run.parse_args([]).context_chars == []
    default, set_ = bench_config(), bench_config(context_chars=dict(args.context_chars))
    assert [s.context_chars for s in set_.tiers.values()] == [default.tier(Tier.EASY).context_chars, 400, 600]
    assert [replace(s, context_chars=1) for s in set_.tiers.values()] == [
        replace(s, context_chars=1) for s in default.tiers.values()]
    for bad in ("HARD=0", "HARD=", "HUGE=300", "600"):
        with pytest.raises(SystemExit):
            run.parse_args(["--context-chars", bad])


def test_scale_sizes_accept_what_help_shows():
    assert run.parse_args(["--scale-sizes", "1k,10k,100k,1M"]).sizes == [1_000, 10_000, 100_000, 1_000_000]
    assert run.parse_args(["--scale-sizes", "2500"]).sizes == [2500]
    with pytest.raises(SystemExit):
        run.parse_args(["--scale-sizes", "10q"])


def test_reader_sweep_precision_is_cross_fitted():
    """The sweep's 'right among the best-scored 25%' ranks by a combiner fitted on the other folds: a feature
    that decides rightness gives 1.0 when rightness is common enough, and pure noise gives about the base rate."""
    from benchmarks.reader_sweep import cross_fitted_scores, top_precision
    from edge_rag.decision.certify import FEATURES

    def cross_fitted_precision(features: list[list[float]], right: list[bool], n: int) -> float:
        y = np.asarray(right, dtype=float)
        return top_precision(cross_fitted_scores(np.asarray(features, dtype=float), y), y, n)

    rng = np.random.default_rng(1)
    right = rng.random(400) < 0.4
    informative = [[float(r) + 0.1 * rng.standard_normal()] + [rng.standard_normal() for _ in FEATURES[1:]]
                   for r in right]
    assert cross_fitted_precision(informative, list(right), 400) == 1.0
    noise = [[rng.standard_normal() for _ in FEATURES] for _ in right]
    assert abs(cross_fitted_precision(noise, list(right), 400) - right.mean()) < 0.15


@pytest.mark.parametrize("argv", [["--parts", "test"], ["--parts", "reader_train,calibration"], ["--parts", ""]])
def test_the_tools_that_choose_a_setting_refuse_the_test_and_calibration_splits(argv: list[str], capsys):
    """benchmarks.fusion and benchmarks.context_index print the fusion setting their rule chooses, reader_sweep the
    numbers a reader default is chosen by: on the test split that is tuning on what is reported, on the calibration
    split it spends the questions the certificate is counted on. They are refused before anything loads."""
    from benchmarks import fusion, reader_sweep, splits

    parse = fusion.arguments("fusion", "").parse_args
    with pytest.raises(SystemExit):
        parse(argv)
    assert "never test or calibration" in capsys.readouterr().err
    assert parse([]).parts == ["reader_train", "reader_val"] and parse(["--parts", "reader_val"]).parts == ["reader_val"]
    for part in ("test", "calibration"):
        with pytest.raises(SystemExit):
            reader_sweep.main(["--part", part])
    assert set(splits.TUNING_PARTS).isdisjoint({"test", "calibration"})


def test_coverage_at_is_the_most_permissive_prefix_within_alpha():
    """Questions answered best-scored first; the share of all questions answered at the last prefix whose error
    among answered is <= alpha (a later prefix counts even when an earlier one went over)."""
    from benchmarks.reader_sweep import coverage_at

    score, wrong = np.array([3.0, 2.0, 1.0, 0.0]), np.array([False, True, False, True])
    assert coverage_at(score, wrong, 5, 0.5) == 0.8  # all four: 2 wrong of 4
    assert coverage_at(score, wrong, 5, 0.4) == 0.6  # three: 1 of 3; the second alone was 1 of 2
    assert coverage_at(score, wrong, 5, 0.0) == 0.2
    assert coverage_at(score[1:2], wrong[1:2], 5, 0.3) == 0.0


def test_combiner_features_shows_what_leaving_a_feature_out_costs(tmp_path, capsys):
    """On rows where only `negated` tells right from wrong, leaving it out drops the cross-fitted AUROC to chance;
    a rows file collected before a feature existed is refused with a message."""
    from benchmarks import combiner_features
    from edge_rag.decision.certify import FEATURES

    rng = np.random.default_rng(2)
    rows = []
    for i in range(300):
        wrong = bool(rng.random() < 0.5)
        features = {f: float(rng.standard_normal()) for f in FEATURES} | {"negated": float(wrong)}
        rows.append({"id": str(i), "features": features, "candidate": "x", "wrong": wrong})
    path = tmp_path / "rows-neural-x.json"
    path.write_text(json.dumps({"reader_val": rows}))
    assert combiner_features.main([str(path)]) == 0
    table = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in capsys.readouterr().out.splitlines()
             if line.startswith("| all") or line.startswith("| without")}
    assert table["all"] > 0.95 and abs(table["without negated"] - 0.5) < 0.15
    old = [{**r, "features": {k: v for k, v in r["features"].items() if k != "negated"}} for r in rows]
    path.write_text(json.dumps({"reader_val": old}))
    with pytest.raises(SystemExit, match="without negated"):
        combiner_features.main([str(path)])


def test_context_index_reads_neighbours_within_a_document(tmp_path):
    """benchmarks.context_index: with the stores' context (store_db.CONTEXT_NEIGHBOURS at CONTEXT_WEIGHT) its index
    ranks as the store's own full-text search; with none (c = 0) only the sentence holding the word is found; with
    c = 1 its neighbours too, ranked below it, and never the next document's first sentence (the next id)."""
    from benchmarks.context_index import context_index, search
    from edge_rag.documents.chunk import make_document
    from edge_rag.storage.store import Store
    from edge_rag.storage.store_db import CONTEXT_NEIGHBOURS, CONTEXT_WEIGHT, Part

    texts = [["The keeper lived alone on the rock", "He painted the lighthouse tower red", "Ships passed it at night"],
             ["The harbour cafe sells soup", "Its terrace faces the quay"]]
    docs = [make_document(" ".join(t), f"doc{i}") for i, t in enumerate(texts)]
    store = Store(tmp_path, 8, "enc")
    store.add([Part(d, 0, t, last=True, sha=d.doc_id) for d, t in zip(docs, texts)], np.eye(8, dtype=np.float32)[:5])
    terms = ["lighthouse", "tower"]
    exact = [i for i, _ in store.search_text(terms, 5)]
    store.close()
    shipped, doc_of = context_index(tmp_path, CONTEXT_NEIGHBOURS)
    assert search(shipped, terms, CONTEXT_WEIGHT, 5) == exact and exact[0] == 1 and sorted(exact) == [0, 1, 2]
    alone, _ = context_index(tmp_path, 0)
    assert search(alone, terms, 0.0, 5) == [1]
    around, _ = context_index(tmp_path, 1)
    found = search(around, terms, 0.5, 5)
    assert found[0] == 1 and sorted(found) == [0, 1, 2] and {doc_of[i] for i in found} == {docs[0].doc_id}
    assert search(around, ["harbour"], 0.5, 5) == [3, 4]  # the cafe's 2 sentences; the rock's third is another document
