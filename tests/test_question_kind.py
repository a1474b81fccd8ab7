"""Each kind of question (single-hop, multi-hop) is decided by a certificate counted on calibration questions of its
kind: the shipped kind model, the shipped per-kind counts, and the certified path choosing by kind."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from serving import MULTI_HOP

from benchmarks import data, splits
from convert.logistic import fit_combiner
from convert.question_kind import CUTS, MAX_SINGLE_AS_MULTI, choose_cut
from edge_rag.config import Config
from edge_rag.decision.certified import CertifiedPath
from edge_rag.decision.certify import CALIBRATION_ASSET, PGVECTOR_CALIBRATION_ASSET, Calibration
from edge_rag.decision.kind import Kind, form
from edge_rag.reading.read import Candidate
from edge_rag.types import Route

SINGLE = "Who designed the pumping station?"
NEURAL = Config(temperature=0.0, certified=True, reader="neural")
CONFIDENT = Candidate("Ada Lovelace", 0, 30.0, -30.0, 60.0)  # a span far above "no answer"


def _multi_hop_share(rc, questions: list[str]) -> float:
    return float(np.mean([rc.kind(q) is Kind.MULTI_HOP for q in questions]))


def test_the_shipped_kind_model_tells_hotpotqa_from_squad_questions(hotpot_path: Path, squad_path: Path):
    """On questions the kind model was neither fitted nor cut on (HotpotQA's reader-val bucket, SQuAD's calibration
    split), most multi-hop questions are called multi-hop and few single-hop ones are."""
    rc = Calibration.load(CALIBRATION_ASSET).reader("neural")
    hotpot = splits.select(data.load("hotpotqa", hotpot_path, None, 0, "all").items, "reader_val")
    squad = splits.select(data.load("squad", squad_path, None, 0, "all").items, "calibration")
    assert _multi_hop_share(rc, [q.question for q in hotpot]) >= 0.6
    assert _multi_hop_share(rc, [q.question for q in squad]) <= 0.1


def test_the_cut_takes_few_single_hop_validation_questions_from_their_certificate(squad_path: Path):
    """The shipped cut is the rule's: the smallest that calls at most MAX_SINGLE_AS_MULTI of SQuAD reader-val
    multi-hop, so a lower one of the grid calls more."""
    rc = Calibration.load(CALIBRATION_ASSET).reader("neural")
    val = [q.question for q in splits.select(data.load("squad", squad_path, None, 0, "all").items, "reader_val")]
    assert rc.kind_model is not None
    assert choose_cut(rc.kind_model, val) == rc.kind_cut
    assert _multi_hop_share(rc, val) <= MAX_SINGLE_AS_MULTI
    if rc.kind_cut > CUTS[0]:
        lower = float(CUTS[list(CUTS).index(rc.kind_cut) - 1])
        assert np.mean([rc.kind_model(form(q)) >= lower for q in val]) > MAX_SINGLE_AS_MULTI


@pytest.mark.parametrize("asset", (CALIBRATION_ASSET, PGVECTOR_CALIBRATION_ASSET), ids=lambda p: p.name)
def test_shipped_calibrations_count_every_calibration_question_under_one_kind(asset: Path):
    raw = json.loads(asset.read_text(encoding="utf-8"))
    rc = Calibration.load(asset).reader("neural")
    assert set(rc.kind_tables) == {Kind.MULTI_HOP}
    source = raw["source"]
    assert rc.table.n_cal + rc.table_of(Kind.MULTI_HOP).n_cal == (source["n_calibration"]
                                                                  + source["n_hotpotqa_calibration"])
    hotpot = raw["readers"]["neural"]["kinds"]["hotpotqa_by_kind"]
    assert sum(hotpot.values()) == source["n_hotpotqa_calibration"]
    assert hotpot[Kind.MULTI_HOP.value] > hotpot[Kind.SINGLE_HOP.value]


def test_a_multi_hop_question_is_decided_by_the_certificate_of_its_kind(sample_rag):
    path = CertifiedPath(sample_rag.bundle, NEURAL)
    rc = path.calibration.reader("neural")
    assert (rc.kind(SINGLE), rc.kind(MULTI_HOP)) == (Kind.SINGLE_HOP, Kind.MULTI_HOP)
    passages = sample_rag.store.passages([0, 1])
    single, multi = (path.decide(q, 0.1, CONFIDENT, passages) for q in (SINGLE, MULTI_HOP))
    assert (single.fields["kind"], multi.fields["kind"]) == ("single-hop", "multi-hop")
    assert single.fields["n_cal"] == rc.table.n_cal
    assert multi.fields["n_cal"] == rc.table_of(Kind.MULTI_HOP).n_cal
    cert = rc.table_of(Kind.MULTI_HOP).choose(NEURAL.max_error_rate, NEURAL.delta)
    assert multi.fields["score_threshold"] == cert.threshold
    answered = multi.fields["score"] >= cert.threshold
    assert (multi.route is Route.RAG) == answered
    if not answered:
        assert "multi-hop" in multi.reason


def test_an_asked_multi_hop_question_says_its_kind_and_why_it_was_refused(sample_rag):
    cert = Calibration.load(CALIBRATION_ASSET).reader("neural").table_of(Kind.MULTI_HOP).choose(
        NEURAL.max_error_rate, NEURAL.delta)
    if math.isfinite(cert.threshold):
        pytest.skip("the shipped calibration certifies some multi-hop answers at the default alpha")
    answer = sample_rag.ask(MULTI_HOP)
    assert answer.to_dict()["kind"] == "multi-hop" and answer.route is Route.REFUSE
    assert "multi-hop" in answer.refusal_reason


def test_a_calibration_without_kinds_decides_every_question_by_its_one_table(sample_rag, tmp_path: Path):
    """An older file, or one of ``edge-rag calibrate`` (a kiosk's own questions), has one table: every question
    is counted there, whatever its form."""
    raw = json.loads(CALIBRATION_ASSET.read_text(encoding="utf-8"))
    raw["readers"]["neural"].pop("kinds")
    old = tmp_path / "calibration.json"
    old.write_text(json.dumps(raw), encoding="utf-8")
    path = CertifiedPath(sample_rag.bundle, NEURAL, old)
    rc = path.calibration.reader("neural")
    assert rc.kind(MULTI_HOP) is Kind.SINGLE_HOP and not rc.kind_tables
    verdict = path.decide(MULTI_HOP, 0.1, CONFIDENT, sample_rag.store.passages([0, 1]))
    assert verdict.fields["n_cal"] == rc.table.n_cal and verdict.fields["kind"] == "single-hop"


def test_a_weighted_fit_is_the_fit_on_rows_repeated_by_their_weight():
    """What the kind model's balanced fit relies on: weight w counts a row as w rows (no ridge: the logistic
    fit is then invariant to how the features are standardised)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    y = (x @ [1.0, -0.5, 0.2] + rng.normal(size=200) > 0).astype(float)
    w = rng.integers(1, 4, size=200)
    weighted = fit_combiner(x, y, l2=0.0, weights=w, features=("a", "b", "c"))
    repeated = fit_combiner(np.repeat(x, w, axis=0), np.repeat(y, w), l2=0.0, features=("a", "b", "c"))
    for row in x[:20]:
        values = dict(zip("abc", row))
        assert weighted(values) == pytest.approx(repeated(values), abs=1e-6)
