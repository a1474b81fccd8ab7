"""The shipped router.onnx and its input (the retrieval profile of the question's search; older routers also
read the query embedding), and how EdgeRAG picks a tier with the router on, off, overridden or missing.

Questions come from the test split of edge_rag/assets/splits.json, which the router was not trained or
selected on; what it scores there is in edge_rag/assets/router_report.md.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import cached_store

from benchmarks.experiments.router_tiers import pooled_alone, tiers
from benchmarks.splits import select
from benchmarks.systems import bench_config
from edge_rag.config import TIERS, Config, Tier, TierSpec
from edge_rag.models import bundle as B
from edge_rag.models.registry import ROUTER_ASSET
from edge_rag.pipeline import EdgeRAG
from edge_rag.retrieval import retrieve
from edge_rag.retrieval.route import PROFILE, PROFILE_K, Router, choose_tier, features, profile, search_width
from edge_rag.types import Passage
from evaluation import datasets

CLEAR_MARGIN = 1e-3  # logit gap above which batch and single-row inference must agree on any CPU


@pytest.fixture(scope="module")
def router() -> Router:
    return Router(ROUTER_ASSET)


@pytest.fixture(scope="module")
def held_out_rows(squad_default_rag) -> tuple[list[str], np.ndarray]:
    """Test-split SQuAD questions and their router input rows, computed as the pipeline computes them."""
    rag, items = squad_default_rag
    questions = [q.question for q in select(items, "test")][:200]
    rows = []
    for q in questions:
        vector = rag.encoder.encode_one(q)
        rows.append(features(vector, q, retrieve.search(rag.store, vector, q, search_width(rag.config),
                                                        rag.config).passages))
    return questions, np.array(rows)


def _hits(*scores: float, texts: tuple[str, ...] = ()) -> list[Passage]:
    texts = texts or tuple(f"Sentence number {i} about nothing." for i in range(len(scores)))
    return [Passage(i, f"d{i}", "", t, score=s) for i, (s, t) in enumerate(zip(scores, texts))]


# -- the retrieval profile -----------------------------------------------------------------------------
def test_profile_reads_the_score_shape():
    flat = profile("q?", _hits(*[0.5] * PROFILE_K))
    assert flat[:3] == pytest.approx([0.5, 0.0, 1.0])
    peaked = profile("q?", _hits(0.9, *[0.3] * (PROFILE_K - 1)))
    assert peaked[0] == pytest.approx(0.9) and peaked[1] == pytest.approx(0.6) and peaked[2] < 0.01
    many = np.linspace(0.8, 0.3, 30)
    assert profile("q?", _hits(*many))[1] == pytest.approx(many[0] - many[4])  # s5, not s30
    assert profile("q?", _hits(0.7, 0.6))[1] == pytest.approx(0.1)  # fewer than 5 hits: the last one
    assert profile("q?", []).tolist() == [0.0] * len(PROFILE)  # no retrieval
    assert 0.0 <= profile("q?", _hits(0.6, 0.59, 0.2))[2] <= 1.0


def test_profile_overlap_finds_where_the_question_terms_are():
    texts = ("Paris is large.", "London has a clock.", "Rome has a river.", "The Eiffel Tower was built in 1889.")
    question = "When was the Eiffel Tower built?"
    overlaps = slice(PROFILE.index("overlap@1"), PROFILE.index("overlap@10") + 1)
    assert profile(question, _hits(0.9, 0.8, 0.7, 0.6, texts=texts))[overlaps].tolist() == pytest.approx([0, 0, 1])
    assert profile(question, _hits(0.9, 0.8, texts=texts[2:]))[overlaps].tolist() == pytest.approx([0, 1, 1])


def test_a_remembered_profile_is_the_same_and_its_own():
    """The route stage and the certified score read one question's profile; the second read is remembered: equal to
    the first, for the same question and hits only, and a caller changing its copy changes no one else's."""
    hits = _hits(0.9, 0.8, texts=("The Eiffel Tower was built in 1889.", "Paris is large."))
    first = profile("When was the Eiffel Tower built?", hits)
    want = first.copy()
    first[:] = -1.0
    assert np.array_equal(profile("When was the Eiffel Tower built?", hits), want)
    assert not np.array_equal(profile("When was the Eiffel Tower built?", hits[::-1]), want)
    assert not np.array_equal(profile("When was Paris founded?", hits), want)


def _docs(*doc_ids: str, texts: tuple[str, ...]) -> list[Passage]:
    return [Passage(i, d, d, t, score=0.8 - 0.01 * i) for i, (d, t) in enumerate(zip(doc_ids, texts))]


def test_profile_sees_a_question_split_over_two_documents():
    """A multi-hop question's best sentence matches its first hop as well as a one-hop question's answer
    sentence matches that question; only the coverage of the top hits together, and the documents they come
    from, tell them apart (the 6-column profile did not: the router sent 89% of HotpotQA to k = 1)."""
    at = {name: PROFILE.index(name) for name in PROFILE}
    two_hop = profile("Which river flows through the city of the Eiffel Tower?", _docs(
        "eiffel", "seine", "rome", texts=("The Eiffel Tower stands in the city of Paris.",
                                          "The river Seine flows through Paris.", "Rome is old.")))
    one_hop = profile("Which river flows through Paris?", _docs(
        "seine", "seine", "rome", texts=("The river Seine flows through Paris.", "The Seine is long.",
                                         "Rome is old.")))
    assert two_hop[at["union@3"]] == pytest.approx(1.0)
    assert two_hop[at["union@3"]] > two_hop[at["overlap@3"]] + 0.3
    assert one_hop[at["union@3"]] == pytest.approx(one_hop[at["overlap@3"]]) == pytest.approx(1.0)
    assert (two_hop[at["docs@3"]], one_hop[at["docs@3"]]) == (3, 2)
    assert (two_hop[at["terms"]], one_hop[at["terms"]]) == (5, 3)  # river flows city eiffel tower; river flows paris
    assert two_hop[at["union@10"]] >= two_hop[at["union@3"]]


def test_profile_sees_a_question_reach_past_the_first_document():
    """Issue #42, second round: with the 10 columns above a short multi-hop question still read as a SQuAD
    question of its length and went to k = 1. A comparison names two documents and the other one adds the rest
    of the question; a one-hop question of the same length is held by its one document."""
    at = {name: PROFILE.index(name) for name in PROFILE}
    two = profile("Which is longer, the Seine or the Thames?", _docs("Seine", "Seine", "Thames", texts=(
        "The Seine is 777 km long.", "The Seine flows through Paris.", "The Thames is 346 km long.")))
    one = profile("How long is the Seine?", _docs("Seine", "Seine", "Rhine", texts=(
        "The Seine is 777 km long.", "The Seine flows through Paris.", "The Rhine is long.")))
    assert two[at["rest@3"]] > 0.25 and one[at["rest@3"]] == 0.0  # Thames: only the other document has it
    assert (two[at["named@3"]], one[at["named@3"]]) == (2, 1)  # titles the question names: Seine, Thames / Seine
    assert two[at["named@10"]] == 2 and two[at["docs@10"]] == one[at["docs@10"]] == 2
    assert (two[at["next-doc"]], two[at["next-gap"]]) == pytest.approx((0.2, 0.02))  # the next document: rank 3
    alone = profile("How long is the Seine?", _docs("Seine", "Seine", texts=("The Seine is long.", "It is.")))
    assert (alone[at["next-doc"]], alone[at["next-gap"]], alone[at["rest@3"]]) == pytest.approx((1.0, 0.01, 0.0))


def test_search_is_wide_enough_for_every_consumer():
    c = Config()
    assert search_width(c) >= max([c.tier(t).k for t in TIERS] + [c.baseline_k]) + c.correction_extra_k
    assert search_width(c) >= max(c.gate_max_n, PROFILE_K)


# -- the shipped router --------------------------------------------------------------------------------
def test_shipped_router_reads_the_profile_only(router: Router, held_out_rows):
    _, rows = held_out_rows
    assert rows.shape[1] == 384 + len(PROFILE) and router.width == len(PROFILE)
    profile = rows[:, 384:]  # s1 - s5, next-gap may be negative: the hybrid list is ordered by fused rank, not cosine
    gaps = [PROFILE.index("s1-s5"), PROFILE.index("next-gap")]
    assert np.isfinite(rows).all() and (np.delete(profile, gaps, axis=1) >= 0).all()
    other = rows.copy()
    other[:, :384] = other[::-1, :384]  # another question's embedding, the same search profile
    assert np.array_equal(router.logits(rows), router.logits(other))
    assert np.array_equal(router.logits(rows), router.logits(rows[:, 384:]))


def test_router_is_deterministic(router: Router, held_out_rows) -> None:
    _, rows = held_out_rows
    first = [TIERS[int(np.argmax(router.logits(r)[0]))] for r in rows]
    logits = router.logits(rows)
    assert np.array_equal(logits, router.logits(rows))
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > CLEAR_MARGIN
    batch = [TIERS[i] for i in np.argmax(logits, axis=1)]
    assert clear.mean() > 0.95
    assert [t for t, c in zip(batch, clear) if c] == [t for t, c in zip(first, clear) if c]


def test_router_uses_more_than_one_tier(router: Router, held_out_rows) -> None:
    _, rows = held_out_rows
    tiers = {TIERS[i] for i in np.argmax(router.logits(rows), axis=1)}
    assert len(tiers) >= 2, tiers


def test_pipeline_routes_on_the_features_training_uses(squad_default_rag, router: Router, held_out_rows) -> None:
    """``ask``/``decide`` route on features(encode_one, search(search_width)): the rows training computes."""
    rag, _ = squad_default_rag
    questions, rows = held_out_rows
    installed, rag.router = rag.router, router  # the shipped asset, whatever router the installed bundle holds
    try:
        for q, row in zip(questions[:40], rows[:40]):
            assert rag.decide(q).tier is TIERS[int(np.argmax(router.logits(row)[0]))]
    finally:
        rag.router = installed


def test_router_sends_multi_hop_questions_past_k1_on_a_corpus_it_never_saw(bundle_dir: Path, hotpot_path: Path,
                                                                         tmp_path: Path, router: Router) -> None:
    """The HotpotQA test split's questions over a store of their own ten paragraphs each alone (distractors
    included; neither questions nor corpus were trained on or chosen on): a context serves one only when it holds
    both supporting paragraphs, so hardly any is EASY (k = 1 sentence). The router before issue #42 sent 87% of
    them to EASY (tier accuracy 0.13): its profile read a strong first-hop match as "the answer sentence is found",
    and SQuAD's 4,381 labels outweighed HotpotQA's 64 in training; the 10-column one of its first fix 40%
    (accuracy 0.50): a short multi-hop question read as a SQuAD question of its length. Today's, with the columns
    that see the question reach past the first document: 21% EASY, accuracy 0.58
    (``python -m benchmarks.experiments.router_tiers``). The store (692 paragraphs, 2,928 passages: 17 s of CPU to
    embed) is kept in tests/.cache, keyed by the split's lines and the code that makes documents of them."""
    ds = pooled_alone(hotpot_path, "test", tmp_path / "cache")
    base = bench_config()

    def build(folder: Path) -> None:
        with EdgeRAG(folder, bundle=bundle_dir, config=base) as rag:
            rag.add_documents(ds.documents)

    db = cached_store(bundle_dir, ds.path.read_bytes() + Path(datasets.__file__).read_bytes(), base, build,
                      tmp_path / "db")
    result = tiers(db, bundle_dir, base, ds.items, router)
    assert result["asked"] == len(ds.items) >= 50 and result["labelled"] >= 25
    assert result["label_share"][Tier.EASY.value] <= 0.1  # the premise: multi-hop questions need more than k = 1
    assert result["router_share"][Tier.EASY.value] <= 0.3
    assert result["accuracy"] >= 0.5


OLD_PROFILE = 6  # the profile before issue #42: s1 ... overlap@10, the leading columns of today's
FIRST_42_PROFILE = 10  # issue #42's first router: those and union@3, union@10, docs@3, terms


@pytest.mark.parametrize("width, columns", [(384, slice(0, 384)), (384 + OLD_PROFILE, slice(0, 384 + OLD_PROFILE)),
                                            (OLD_PROFILE, slice(384, 384 + OLD_PROFILE)),
                                            (FIRST_42_PROFILE, slice(384, 384 + FIRST_42_PROFILE))])
def test_an_older_router_gets_the_columns_it_was_trained_on(tmp_path: Path, width: int, columns: slice) -> None:
    """Older bundles hold a 384-wide router (the embedding alone), a 390-wide one (embedding, then the 6-column
    profile), a 6-wide one (that profile alone) or a 10-wide one (the 10-column profile): each is fed the
    columns it was trained on, which the profile's newer columns, appended after them, leave in place."""
    torch = pytest.importorskip("torch")
    from convert.router import RouterMLP, export_router

    torch.manual_seed(0)
    export_router(RouterMLP(in_dim=width).eval(), tmp_path / "old.onnx")
    old = Router(tmp_path / "old.onnx")
    vector = np.ones(384, np.float32) / np.sqrt(384)
    hits = _hits(0.9, 0.5)
    row = features(vector, "q?", hits)
    assert old.width == width and PROFILE[:OLD_PROFILE] == ("s1", "s1-s5", "entropy", "overlap@1", "overlap@3",
                                                            "overlap@10")
    assert old(vector, "q?", hits) is TIERS[int(np.argmax(old.logits(row[columns])[0]))]
    assert np.array_equal(old.logits(row), old.logits(row[columns]))


# -- choose_tier (EdgeRAG's tier step): router on, off, overridden, missing -----------------------------
QUESTION = "Who founded the Harbourlight Science Museum?"


def _hits_of(rag: EdgeRAG, vector: np.ndarray) -> list[Passage]:
    return rag.store.search(vector, search_width(rag.config))


def test_router_on_routes_by_the_model(sample_rag: EdgeRAG) -> None:
    vector = sample_rag.encoder.encode_one(QUESTION)
    answer = sample_rag.decide(QUESTION)
    assert answer.tier is sample_rag.router(vector, QUESTION, _hits_of(sample_rag, vector)) and not answer.tier_fallback
    assert answer.context_chars <= sample_rag.config.tier(answer.tier).context_chars


def test_router_off_uses_baseline_k_and_the_fallback_tier(sample_rag: EdgeRAG) -> None:
    c = Config(router=False, baseline_k=3)
    vector = sample_rag.encoder.encode_one(QUESTION)
    tier, spec, fallback = choose_tier(vector, QUESTION, _hits_of(sample_rag, vector), sample_rag.router, c)
    base = c.tier(c.fallback_tier)
    assert (tier, fallback) == (c.fallback_tier, False)
    assert spec == TierSpec(3, base.context_chars, base.max_new_tokens, False)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("router", [True, False])
def test_override_wins_over_the_router(sample_rag: EdgeRAG, tier: Tier, router: bool) -> None:
    """Also with the router off: Config(tier_override=HARD, router=False) answered every question in MEDIUM's budget
    with baseline_k passages (465 context characters where HARD gives 889 on the sample)."""
    vector = sample_rag.encoder.encode_one(QUESTION)
    c = Config(tier_override=tier, router=router)
    assert choose_tier(vector, QUESTION, _hits_of(sample_rag, vector), sample_rag.router, c) == (tier, c.tier(tier), False)


def test_missing_router_falls_back_and_says_so(bundle_dir: Path, tmp_path: Path) -> None:
    """A bundle without router.onnx: every question gets the config's fallback tier, recorded in the Answer."""
    assert choose_tier(np.zeros(384, np.float32), QUESTION, [], None, Config()) == (Tier.MEDIUM, Config().tier(Tier.MEDIUM), True)
    no_router = tmp_path / "bundle"
    no_router.mkdir()
    manifest = json.loads((bundle_dir / B.MANIFEST).read_text(encoding="utf-8"))
    manifest[B.KEY_FILES] = [f for f in manifest[B.KEY_FILES] if f["role"] != B.ROLE_ROUTER]
    for f in manifest[B.KEY_FILES]:
        os.symlink(bundle_dir / f["name"], no_router / f["name"])
    (no_router / B.MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    with EdgeRAG(tmp_path / "db", bundle=no_router, config=Config(fallback_tier=Tier.HARD)) as rag:
        assert rag.router is None
        rag.add_documents(["The Harbourlight Science Museum was founded by Margaret Hollins in 1921."])
        answer = rag.decide(QUESTION)
        assert (answer.tier, answer.tier_fallback) == (Tier.HARD, True)
        answer = rag.decide("When was the museum founded?")
        assert (answer.tier, answer.tier_fallback) == (Tier.HARD, True)
