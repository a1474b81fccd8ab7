"""Router training: the oracle labelling rule, the label cache, the split, the training loop, and one
small end-to-end run on real questions through the real pipeline to an ONNX the runtime loads."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from convert.train_router import (
    benchmark_articles,
    class_weights,
    evaluate,
    is_correct,
    label_items,
    oracle_label,
    rank,
    split,
    train,
    train_router,
)
from edge_rag.config import Config, Tier
from edge_rag.route import Router
from edge_rag.types import Answer, Route
from evaluation.datasets import QAItem, load_hotpot, load_squad


def _answer(text: str | None, route: Route = Route.RAG) -> Answer:
    return Answer(question="q", answer=text, route=route, tier=Tier.EASY)


def _asker(replies: dict[Tier, Answer], calls: list | None = None):
    """A stand-in pipeline: fixed answers per tier, recording each call."""
    calls = [] if calls is None else calls

    def ask_at(tier: Tier, question: str) -> Answer:
        calls.append((tier, question))
        return replies[tier]

    return ask_at


def _item(dataset: str = "squad", answers: tuple[str, ...] = ("Eiffel Tower",), qid: str = "q1") -> QAItem:
    return QAItem(id=qid, question=f"question {qid}?", answers=list(answers), dataset=dataset)


# -- the labelling rule --------------------------------------------------------------------------
@pytest.mark.parametrize("text, route, golds, correct", [
    ("the Eiffel Tower", Route.RAG, ["Eiffel Tower"], True),    # EM after SQuAD normalisation
    ("in 1889", Route.GPT, ["1889"], True),                     # F1 0.67
    ("w x y p q", Route.GPT, ["w x y r s"], True),              # F1 exactly 0.6 counts
    ("built in 1889 Paris", Route.GPT, ["1889"], False),        # F1 0.4
    ("Paris", Route.RAG, ["Lyon", "Paris, France", "Paris"], True),  # any gold answer
    ("Paris", Route.REFUSE, ["Paris"], False),                  # a refusal is wrong, whatever it carries
    (None, Route.GPT, ["Paris"], False),                        # empty generation
])
def test_is_correct(text, route, golds, correct):
    assert is_correct(_answer(text, route), golds) is correct


def test_label_is_the_cheapest_correct_tier_and_stops_there():
    calls: list = []
    replies = {Tier.EASY: _answer("Louvre"), Tier.MEDIUM: _answer("Eiffel Tower"), Tier.HARD: _answer("Eiffel Tower")}
    row = oracle_label(_item(), _asker(replies, calls))
    assert row["label"] == "MEDIUM" and row["oracle"]
    assert [t for t, _ in calls] == [Tier.EASY, Tier.MEDIUM]  # HARD is never run
    assert [t["correct"] for t in row["tries"]] == [False, True]

    row = oracle_label(_item(), _asker({Tier.EASY: _answer("eiffel tower.")}))
    assert row["label"] == "EASY" and len(row["tries"]) == 1


@pytest.mark.parametrize("dataset, fallback", [("hotpotqa", "HARD"), ("squad", "MEDIUM")])
def test_no_correct_tier_falls_back_by_dataset(dataset, fallback):
    calls: list = []
    replies = {Tier.EASY: _answer("Eiffel Tower", Route.REFUSE), Tier.MEDIUM: _answer("Louvre", Route.GPT),
               Tier.HARD: _answer(None, Route.REFUSE)}
    row = oracle_label(_item(dataset), _asker(replies, calls))
    assert row["label"] == fallback and not row["oracle"]
    assert len(calls) == 3


def test_label_cache_skips_the_pipeline(tmp_path):
    path = tmp_path / "labels.jsonl"
    items = [_item(qid=f"q{i}") for i in range(4)]
    calls: list = []
    ask = _asker({t: _answer("Louvre") for t in Tier}, calls)
    first = label_items(items, ask, path, key="k1")
    assert len(calls) == 12 and [r["label"] for r in first] == ["MEDIUM"] * 4

    calls.clear()
    assert label_items(items, ask, path, key="k1") == first and calls == []  # all cached
    label_items(items + [_item(qid="q9")], ask, path, key="k1")
    assert {q for _, q in calls} == {"question q9?"}  # only the new question runs
    calls.clear()
    label_items(items[:1], ask, path, key="k2")  # other pipeline settings: labelled again
    assert len(calls) == 3
    assert len(path.read_text().splitlines()) == 6


# -- the split -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qa_items(squad_path, hotpot_path) -> list[QAItem]:
    return load_squad(squad_path)[1] + load_hotpot(hotpot_path)[1]


def test_split_holds_out_whole_articles_and_never_leaks(qa_items):
    parts = split(qa_items, seed=0)
    bench, train_ids, val_ids = ({q.id for q in parts[k]} for k in ("benchmark", "train", "val"))
    assert not bench & (train_ids | val_ids) and not train_ids & val_ids

    held = benchmark_articles(qa_items)
    assert len(held) == 2
    for q in qa_items:
        if q.dataset == "squad":
            assert (q.id in bench) == (q.group in held)  # an article is entirely on one side
    assert all(q.answers and not q.is_impossible for q in parts["train"] + parts["val"])

    hotpot = [q for q in qa_items if q.dataset == "hotpotqa"]
    assert 0.12 <= sum(q.id in bench for q in hotpot) / len(hotpot) <= 0.28
    for dataset in ("squad", "hotpotqa"):
        n_val, n_train = (sum(q.dataset == dataset for q in parts[k]) for k in ("val", "train"))
        assert abs(n_val / (n_val + n_train) - 0.15) < 0.01

    other = split(qa_items, seed=1)
    assert {q.id for q in other["benchmark"]} == bench  # the benchmark part does not move with the seed
    assert {q.id for q in other["val"]} != val_ids


def test_limit_takes_a_prefix_of_the_labelling_order(qa_items):
    full = split(qa_items, seed=0)
    order = sorted(full["train"] + full["val"], key=lambda q: rank(q, 0))
    small = split(qa_items, seed=0, limit=100)
    assert {q.id for q in small["train"] + small["val"]} == {q.id for q in order[:100]}


# -- training ------------------------------------------------------------------------------------
def test_class_weights_are_inverse_frequency():
    w = class_weights(torch.tensor([0, 0, 1, 2, 2, 2]))
    assert torch.allclose(w, torch.tensor([1.0, 2.0, 6 / 9]))


def test_training_is_deterministic_and_keeps_the_best_epoch():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((240, 384)).astype(np.float32))
    y = torch.from_numpy((x[:, 0] > 0.5).long().numpy() + (x[:, 1] > 1.0).long().numpy())
    (a, hist), (b, _) = (train(x[:200], y[:200], x[200:], y[200:], epochs=8, seed=3) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    metrics = evaluate(a, x[200:], y[200:], y[:200])
    assert metrics["val_accuracy"] == pytest.approx(max(hist["val_acc"]))
    assert hist["val_acc"][hist["best_epoch"] - 1] == max(hist["val_acc"])
    assert sum(map(sum, metrics["confusion"])) == 40


# -- end to end on real questions ----------------------------------------------------------------
def _small_data(squad_path, hotpot_path, folder):
    """4 SQuAD articles (2 paragraphs each) and 4 HotpotQA rows: 2 articles and some rows are held out."""
    squad = json.loads(squad_path.read_text())
    data = [{**a, "paragraphs": a["paragraphs"][:2]} for a in squad["data"][:4]]
    (folder / "squad.json").write_text(json.dumps({"version": "v2.0", "data": data}))
    rows = hotpot_path.read_text().splitlines()[:4]
    (folder / "hotpot.jsonl").write_text("\n".join(rows) + "\n")
    return folder / "squad.json", folder / "hotpot.jsonl"


def test_train_router_end_to_end(bundle_dir, squad_path, hotpot_path, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_RAG_HOME", str(tmp_path / "home"))  # corpus store + label cache
    squad, hotpot = _small_data(squad_path, hotpot_path, tmp_path)
    base = Config(temperature=0.0)
    config = base.with_(tiers={t: replace(s, max_new_tokens=8) for t, s in base.tiers.items()})  # fast GPT route
    out = tmp_path / "out"
    report = train_router(squad, hotpot, out, bundle_dir=bundle_dir, limit=12, epochs=5, config=config)

    assert report["labels"]["total"] == 12 and report["parity"]["passed"]
    assert sum(report["labels"]["overall"][t.value] for t in Tier) == 12
    rows = [json.loads(line) for line in (tmp_path / "home" / "router" / "labels.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(r["tries"] and r["label"] in {t.value for t in Tier} for r in rows)

    saved = json.loads((out / "split.json").read_text())
    assert len(saved["train"]) + len(saved["val"]) == 12 and saved["val"]
    assert not set(saved["benchmark"]) & set(saved["train"] + saved["val"])
    for name in ("router_report.md", "router_report.json", "router_training.png", "router_confusion.png",
                 "router_labels.png", "router.onnx.parity.json"):
        assert (out / name).is_file(), name
    assert (out / "router.onnx").stat().st_size < 2_000_000
    assert set(report["benchmark_n"]) == {"squad", "hotpotqa"}

    router = Router(out / "router.onnx")
    tier = router(np.ones(384, dtype=np.float32) / np.sqrt(384))
    assert isinstance(tier, Tier)
