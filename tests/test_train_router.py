"""Router training: the split, the label rule and cache, the training loop, and one small end-to-end run
on real questions through the real pipeline to an ONNX the runtime loads."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import DATA

from benchmarks.splits import hotpot_bucket
from convert.train_router import (
    INPUTS,
    LABELS_FILE,
    accuracies,
    class_weights,
    cross_validate,
    dataset_weights,
    evaluate,
    input_columns,
    label_config,
    load_corpora,
    read_labels,
    route_features,
    router_part,
    select,
    settings_key,
    train,
    train_router,
    write_labels,
)
from edge_rag.config import TIERS, Tier
from edge_rag.models import bundle as B
from edge_rag.models.registry import ROUTER_ASSET
from edge_rag.retrieval import retrieve
from edge_rag.retrieval.route import PROFILE, Router, features, search_width
from evaluation.datasets import QAItem
from evaluation.tiers import contains_answer, label, serves


def _item(dataset: str = "squad", answers: tuple[str, ...] = ("Eiffel Tower",), qid: str = "q1", group: str = "",
          gold: frozenset[str] = frozenset(), impossible: bool = False) -> QAItem:
    return QAItem(id=qid, question=f"question {qid}?", answers=list(answers), dataset=dataset, gold_doc_ids=gold,
                  group=group, is_impossible=impossible)


# -- the label rule ------------------------------------------------------------------------------
@pytest.mark.parametrize("context, golds, found", [
    ("Paris: The Eiffel Tower was built in 1889.", ["eiffel tower"], True),   # SQuAD normalisation
    ("It was built in 18890.", ["1889"], False),                            # whole words only
    ("The tower, built in 1889, is tall.", ["1889"], True),                 # punctuation is not a word
    ("Paris is in France.", ["Lyon", "France"], True),                       # any gold answer
    ("Paris is in France.", [], False),
])
def test_contains_answer(context, golds, found):
    assert contains_answer(context, golds) is found


def test_hotpot_needs_both_supporting_paragraphs_and_the_answer():
    q = _item("hotpotqa", ("Chief of Protocol",), gold=frozenset({"a", "b"}))
    ctx = "Shirley Temple: she served as Chief of Protocol."
    assert serves(q, ctx, {"a", "b", "c"})
    assert not serves(q, ctx, {"a", "c"})  # one supporting paragraph missing
    assert not serves(q, "Shirley Temple: an actress.", {"a", "b"})  # answer missing
    yes = _item("hotpotqa", ("yes",), gold=frozenset({"a", "b"}))
    assert serves(yes, "Nothing says yes here.", {"a", "b"}) and not serves(yes, "", {"a"})  # yes/no: evidence only


def test_label_is_the_cheapest_serving_tier():
    assert label([False, True, True]) is Tier.MEDIUM
    assert label([True, False, False]) is Tier.EASY
    assert label([False, False, False]) is None  # no tier serves: not trained on


def test_label_cache_round_trip_and_settings_key(tmp_path):
    path = tmp_path / "labels.csv"
    rows = [{"id": "q1", "part": "train", "dataset": "squad", "served": [False, True, True], "chars": [300, 512, 700]},
            {"id": "q2", "part": "test", "dataset": "hotpotqa", "served": [False] * 3, "chars": [1, 2, 3]}]
    write_labels(path, "k1", rows)
    assert read_labels(path, "k1") == {r["id"]: r for r in rows}
    assert read_labels(path, "k2") == {}  # other settings: everything is labelled again
    assert read_labels(tmp_path / "absent.csv", "k1") == {}


def test_a_label_cache_cut_short_by_a_failed_write_is_labelled_again(tmp_path):
    """make router keeps its labels (minutes of decide() per question) in router_labels.csv. A write the disk cut
    short (the file-size limit here: EFBIG part-way, as ENOSPC would) left half a file whose last row read back as
    a wrong label or a ValueError; the cache is now whole or absent, so the questions are labelled again."""
    import subprocess
    import sys

    path = tmp_path / "labels.csv"
    code = ("import resource, sys\nfrom pathlib import Path\nfrom convert.train_router import write_labels\n"
            "rows = [{'id': f'q{i:05d}', 'part': 'train', 'dataset': 'squad', 'served': [False, True, True],"
            " 'chars': [300 + i, 512, 700]} for i in range(20000)]\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (65536 + 17, 65536 + 17))\n"  # cut inside a row
            "write_labels(Path(sys.argv[1]), 'k1', rows)\n")
    failed = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert failed.returncode != 0 and "File too large" in failed.stderr, failed.stderr[-300:]
    assert read_labels(path, "k1") == {}



def test_shipped_labels_are_for_the_current_config(bundle, squad_path, hotpot_path):
    """`make router` re-labels nothing: the shipped cache was made with today's encoder, contexts and data.
    Fails when a change shapes the labelled contexts: re-run `make router` and commit router_labels.csv."""
    corpora = load_corpora(squad_path, squad_path.parent / "squad2_train_subset.json", hotpot_path)
    encoder_sha = next(f["sha256"] for f in bundle.files() if f["role"] == B.ROLE_ENCODER)
    key = settings_key(encoder_sha, label_config(), corpora)
    shipped = read_labels(ROUTER_ASSET.parent / LABELS_FILE, key)
    assert len(shipped) == sum(len(c.dataset.items) for c in corpora)
    # a field that only shapes the answer keeps the labels; one that shapes contexts does not
    assert settings_key(encoder_sha, label_config().with_(max_error_rate=0.2, reader="rules"), corpora) == key
    assert settings_key(encoder_sha, label_config().with_(compression_floor=0.5), corpora) != key


SQUAD_GIVE = 0.03  # SQuAD tier accuracy the router may give up to always-EASY for multi-hop questions (issue #42)
SQUAD_BALANCE_MARGIN = 0.02  # SQuAD balanced accuracy above always-EASY's 1/3 (0.05 before issue #42's second round)


def test_shipped_router_beats_the_majority_on_held_out_labels(bundle, squad_path, hotpot_path, squad_default_rag):
    """On the test split's genuine SQuAD labels the shipped router is better balanced than always-EASY and
    about as accurate: a router whose input learns the training articles' topics — as the query embedding did —
    falls back to the majority class and fails the balance. Before issue #42 it was at least as accurate as
    always-EASY here (0.860 vs 0.844) because it had learnt SQuAD's rule alone and sent 89% of HotpotQA
    questions to EASY; weighing both datasets alike it gives a little of that up (0.825 with the hybrid
    retrieval of today; HotpotQA's test accuracy 0.135 -> 0.568, test_router.py asks it on a corpus of its own).
    The 16-column router gives up SQuAD balance in turn (0.462 -> 0.366; accuracy 0.825 -> 0.830; HotpotQA
    0.568 -> 0.784): it sends 94% of SQuAD to EASY and is balanced only a little above always-EASY's 1/3
    (docs/decisions/router-input.md; a lowered margin, the lead's call)."""
    corpora = load_corpora(squad_path, squad_path.parent / "squad2_train_subset.json", hotpot_path)
    encoder_sha = next(f["sha256"] for f in bundle.files() if f["role"] == B.ROLE_ENCODER)
    rows = read_labels(ROUTER_ASSET.parent / LABELS_FILE, settings_key(encoder_sha, label_config(), corpora))
    rag, items = squad_default_rag
    test = [(q, TIERS.index(t)) for q in items if (r := rows.get(q.id)) and r["part"] == "test"
            and (t := label(r["served"])) is not None]
    assert len(test) > 300
    x = np.array([route_features(rag, q.question) for q, _ in test])
    y = np.array([t for _, t in test])
    predicted = Router(ROUTER_ASSET).logits(x).argmax(1)
    accuracy = float(np.mean(predicted == y))
    balanced = float(np.mean([np.mean(predicted[y == c] == c) for c in np.unique(y)]))
    assert accuracy >= float(np.mean(y == np.bincount(y).argmax())) - SQUAD_GIVE
    assert balanced >= 1 / 3 + SQUAD_BALANCE_MARGIN


# -- the split -----------------------------------------------------------------------------------
def test_router_parts_follow_splits_json():
    assert router_part(_item(group="Imperialism"), False) == "val"
    assert router_part(_item(group="Steam engine"), False) == "test"
    assert router_part(_item(group="Normans"), False) == "train"
    assert router_part(_item(group="Huguenot"), False) is None  # calibration: the certified threshold's
    assert router_part(_item(group="Beyoncé"), True) == "train"  # the SQuAD-2 train file
    assert router_part(_item(group="Normans", answers=(), impossible=True), False) is None
    by_bucket = {hotpot_bucket(f"id{i}"): f"id{i}" for i in range(40)}
    assert router_part(_item("hotpotqa", qid=by_bucket[0]), False) == "test"
    assert router_part(_item("hotpotqa", qid=by_bucket[4]), False) == "val"
    assert router_part(_item("hotpotqa", qid=by_bucket[2]), False) == "train"


def test_parts_are_disjoint_by_article(squad_path, hotpot_path):
    corpora = load_corpora(squad_path, DATA / "squad2_train_subset.json", hotpot_path)
    seen: dict[str, str] = {}
    for c in corpora:
        for q in c.dataset.items:
            assert q.answers and not q.is_impossible
            key = q.group if q.dataset == "squad" else f"bucket {hotpot_bucket(q.id)}"
            assert seen.setdefault(f"{c.name}:{key}", c.parts[q.id]) == c.parts[q.id]  # one part per article
    parts = {c.name: {p for p in c.parts.values()} for c in corpora}
    assert parts == {"squad": {"train", "val", "test"}, "squad_train": {"train"}, "hotpotqa": {"train", "val", "test"}}


# -- training ------------------------------------------------------------------------------------
def test_class_weights_are_inverse_frequency():
    w = class_weights(torch.tensor([0, 0, 1, 2, 2, 2]))
    assert torch.allclose(w, torch.tensor([1.0, 2.0, 6 / 9]))


def test_each_dataset_weighs_alike_in_the_loss_and_in_selection():
    """4,381 SQuAD labels against 64 HotpotQA ones: unweighted, the router learnt SQuAD's rule alone."""
    source = np.array(["squad"] * 6 + ["hotpotqa"] * 2)
    w = dataset_weights(source)
    assert float(w[:6].sum()) == pytest.approx(float(w[6:].sum())) == pytest.approx(4.0)
    pred, y = torch.tensor([0, 0, 0, 0, 0, 0, 0, 1]), torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])
    assert accuracies(pred, y, source) == {"hotpotqa": 0.5, "squad": 1.0}
    assert accuracies(pred, y, None) == {"": 7 / 8}


def test_training_learns_a_small_dataset_that_disagrees_with_a_large_one():
    """A small dataset whose rows lie among the large one's but need another tier (multi-hop questions whose
    profile looks like SQuAD's EASY ones): weighted by dataset the router learns them; unweighted the large
    dataset's tier wins there."""
    rng = np.random.default_rng(0)
    big, small = rng.uniform(0, 1, (600, 2)), rng.uniform(0, 1, (40, 2))
    small[:, 0] = 0.5 + small[:, 0] / 2  # all in the right half, where 300 rows of the big one say EASY
    x = torch.from_numpy(np.vstack([big, small]).astype(np.float32))
    y = torch.from_numpy(np.r_[np.zeros(600), np.full(40, 2)].astype(np.int64))
    source = np.array(["big"] * 600 + ["small"] * 40)
    held = np.r_[np.arange(0, 600, 10), np.arange(600, 640, 4)]
    fit = np.setdiff1d(np.arange(640), held)
    args = (x[fit], y[fit], x[held], y[held])
    _, plain = train(*args, epochs=10, seed=0, weighted=False, source_val=source[held])
    _, balanced = train(*args, epochs=10, seed=0, weighted=False, source=source[fit], source_val=source[held])
    assert plain["val_acc_by"][plain["best_epoch"] - 1]["small"] <= 0.2
    assert balanced["val_acc_by"][balanced["best_epoch"] - 1]["small"] >= 0.8


def _toy(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((240, 384 + len(PROFILE))).astype(np.float32))
    y = torch.from_numpy((x[:, 0] > 0.5).long().numpy() + (x[:, 1] > 1.0).long().numpy())
    return x, y


def test_training_is_deterministic_and_keeps_the_best_epoch():
    x, y = _toy()
    (a, hist), (b, _) = (train(x[:200], y[:200], x[200:], y[200:], epochs=8, seed=3) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    with torch.no_grad():
        pred = a(x[200:]).argmax(1).numpy()
    metrics = evaluate(pred, y[200:].numpy(), y[:200].numpy())
    assert metrics["accuracy"] == pytest.approx(max(hist["val_acc"]))
    assert hist["val_acc"][hist["best_epoch"] - 1] == max(hist["val_acc"])
    assert sum(map(sum, metrics["confusion"])) == 40 == metrics["n"]


def test_input_columns_pick_the_profile_or_everything():
    assert input_columns("profile", 384 + len(PROFILE)) == slice(384, 384 + len(PROFILE))
    assert input_columns("embedding+profile", 390) == slice(0, 390)
    with pytest.raises(ValueError, match="embedding"):
        input_columns("embedding", 390)


def test_cross_validation_never_splits_a_group():
    """Each group is held out whole exactly once: a group whose rows could be learnt by heart (same features,
    same label) scores like chance, not like memory, when the others say otherwise."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 4)).astype(np.float32)
    groups = np.repeat(np.arange(6), 50).astype(str)
    y = np.where(groups == "0", 2, (x[:, 0] > 0).astype(int))  # group 0 alone is all HARD
    a = cross_validate(x, y, groups, folds=3, epochs=6, seed=1)
    assert a == cross_validate(x, y, groups, folds=3, epochs=6, seed=1)  # deterministic
    assert a["n"] == 300 and a["groups"] == 6 and a["folds"] == 3 and 1 <= a["best_epoch"] <= 6
    assert 0.0 <= a["last"] <= a["best"] <= 5 / 6 + 1e-9  # group 0 is never right: no other group is HARD


def test_selection_keeps_the_better_val_run():
    x, y = _toy(1)
    model, hist, scores = select(x[:200], y[:200], x[200:], y[200:], epochs=5, seed=0)
    assert set(scores) == {"weighted", "unweighted"}
    assert max(hist["val_acc"]) == max(scores.values())



# -- end to end on real questions ----------------------------------------------------------------
ARTICLES = {"Steam_engine": "test", "Imperialism": "val", "Normans": "train"}
HOTPOT_ROWS = 2  # per part. A row brings its 10 paragraphs (~7 KB): 3 rows were 90% of the 67 KB indexed; 2 keep
# a labelled HotpotQA test question (metrics of an empty part hold NaN, and NaN != NaN fails the re-run check)


def _small_data(squad_path, hotpot_path, folder):
    """2 paragraphs of a test, a val and a train article, 2 of a train-file article, ``HOTPOT_ROWS`` HotpotQA rows
    per part (test, val, train: every part and dataset the run splits, labels, trains on and reports)."""
    squad = json.loads(squad_path.read_text())
    data = [{**a, "paragraphs": a["paragraphs"][:2]} for a in squad["data"] if a["title"] in ARTICLES]
    (folder / "squad.json").write_text(json.dumps({"version": "v2.0", "data": data}))
    train = json.loads((DATA / "squad2_train_subset.json").read_text())
    (folder / "train.json").write_text(json.dumps({"version": "v2.0", "data": [
        {**train["data"][0], "paragraphs": train["data"][0]["paragraphs"][:2]}]}))
    picked: dict[int, list[str]] = {}
    for line in hotpot_path.read_text().splitlines():
        bucket = hotpot_bucket(json.loads(line)["question_id"])
        if len(picked.setdefault(bucket, [])) < HOTPOT_ROWS:
            picked[bucket].append(line)
    (folder / "hotpot.jsonl").write_text("\n".join(line for b in (0, 2, 4) for line in picked[b]) + "\n")
    return folder / "squad.json", folder / "train.json", folder / "hotpot.jsonl"


def test_train_router_end_to_end(bundle_dir, squad_path, hotpot_path, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_RAG_HOME", str(tmp_path / "home"))  # the corpus stores
    squad, train_file, hotpot = _small_data(squad_path, hotpot_path, tmp_path)
    out = tmp_path / "out"
    report = train_router(squad, train_file, hotpot, out, bundle_dir=bundle_dir, epochs=5, agreement_n=1,
                          floors=(0.0, 0.5), cv_folds=2)
    assert report["parity"]["passed"]
    rows = read_labels(out / "router_labels.csv", report["settings_key"])
    assert {r["part"] for r in rows.values()} == {"train", "val", "test"}
    assert all(r["dataset"] in ("squad", "hotpotqa") and len(r["served"]) == len(r["chars"]) == 3 for r in rows.values())
    assert sum(sum(c.values()) for c in report["labels"].values()) == len(rows)
    for name in ("router_report.md", "router_report.json", "router_training.png", "router_confusion.png",
                 "router_labels.png", "router.onnx.parity.json"):
        assert (out / name).is_file(), name
    assert [f["floor"] for f in report["floors"]] == [0.0, 0.5] and report["agreement"]["n"] == 1
    fit = sum(r["part"] in ("train", "val") and label(r["served"]) is not None for r in rows.values())
    assert set(report["cv"]) == set(INPUTS) and all(c["n"] == fit and 0 <= c["best"] <= 1 for c in report["cv"].values())
    assert "cross-validation" in (out / "router_report.md").read_text()
    assert set(report["test_mix"]) == {"squad", "hotpotqa"}

    # labels are cached: a second run re-labels nothing and trains the same router
    again = train_router(squad, train_file, hotpot, tmp_path / "again", labels=out / "router_labels.csv",
                         bundle_dir=bundle_dir, epochs=5)
    assert again["metrics"] == report["metrics"]

    router = Router(out / "router.onnx")
    assert router.width == len(PROFILE)
    assert isinstance(router(np.ones(384, dtype=np.float32) / np.sqrt(384), "Who?", []), Tier)


def test_training_features_are_the_pipelines(squad_default_rag):
    """route_features (training) = features(encode_one, retrieve.search(search_width)) (the pipeline's calls: the
    hybrid list, not the dense one the router was once trained on by mistake)."""
    rag, items = squad_default_rag
    for q in items[:20]:
        vector = rag.encoder.encode_one(q.question)
        found = retrieve.search(rag.store, vector, q.question, search_width(rag.config), rag.config)
        want = features(vector, q.question, found.passages)
        assert np.array_equal(route_features(rag, q.question), want)
    assert len(TIERS) == 3


@pytest.mark.parametrize("argv", [["--epochs", "0"], ["--cv", "1"], ["--cv", "-2"], ["--agreement", "-1"],
                                  ["--hotpot", "no-such-file.jsonl"]])
def test_make_router_refuses_nonsense_arguments_when_parsed(argv, capsys):
    """--epochs 0 (TypeError: no best epoch's state) and --cv 1 (ZeroDivisionError) failed only after every question
    was labelled, --agreement -1 sliced all but one val question: each is now a usage error before anything runs."""
    import argparse

    from convert import train_router as T

    parser = argparse.ArgumentParser()
    T.register(parser.add_subparsers())
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["train-router", *argv])
    assert exc.value.code == 2 and argv[0] in capsys.readouterr().err
    assert parser.parse_args(["train-router", "--cv", "0", "--epochs", "1"]).cv == 0
