"""What the shipped router.onnx routes, and how EdgeRAG picks a tier with the router off, missing or overridden.

Questions come from the router split's benchmark part (edge_rag/assets/split.json), which the router
was not trained or validated on. Measured when written (`pytest tests/test_router.py -s`): SQuAD 865
held-out questions EASY 330 / MEDIUM 318 / HARD 217 (mean tier index 0.87); HotpotQA 70 held-out
questions EASY 9 / MEDIUM 6 / HARD 55 (mean 1.66).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from edge_rag import bundle as B
from edge_rag.config import TIERS, Config, Tier, TierSpec
from edge_rag.pipeline import EdgeRAG
from edge_rag.route import Router, choose_tier
from evaluation.datasets import load_hotpot, load_squad

SPLIT = Path(__file__).resolve().parent.parent / "edge_rag" / "assets" / "split.json"
CLEAR_MARGIN = 1e-3  # logit gap above which batch and single-row inference must agree on any CPU


@pytest.fixture(scope="module")
def router(bundle: B.Bundle) -> Router:
    return Router(bundle.require(B.ROLE_ROUTER))


@pytest.fixture(scope="module")
def held_out(encoder, squad_path: Path, hotpot_path: Path) -> dict[str, np.ndarray]:
    """Embeddings of the held-out questions of each dataset."""
    ids = set(json.loads(SPLIT.read_text(encoding="utf-8"))["benchmark"])
    squad = [q.question for q in load_squad(squad_path)[1] if q.id in ids]
    hotpot = [q.question for q in load_hotpot(hotpot_path)[1] if q.id in ids]
    assert len(squad) >= 500 and len(hotpot) >= 50
    return {"squad": encoder.encode(squad), "hotpot": encoder.encode(hotpot)}


def _tiers(router: Router, vectors: np.ndarray) -> list[Tier]:
    return [router(v) for v in vectors]


def test_router_is_deterministic(router: Router, held_out: dict[str, np.ndarray]) -> None:
    vectors = held_out["squad"]
    first = _tiers(router, vectors)
    assert _tiers(router, vectors) == first
    logits = router.logits(vectors)
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > CLEAR_MARGIN
    batch = [TIERS[i] for i in np.argmax(logits, axis=1)]
    assert clear.mean() > 0.95
    assert [t for t, c in zip(batch, clear) if c] == [t for t, c in zip(first, clear) if c]


def test_router_uses_every_tier_on_a_realistic_mix(router: Router, held_out: dict[str, np.ndarray]) -> None:
    tiers = _tiers(router, np.vstack([held_out["squad"], held_out["hotpot"]]))
    shares = {t: tiers.count(t) / len(tiers) for t in TIERS}
    print("tier shares", {t.value: round(s, 3) for t, s in shares.items()})
    assert min(shares.values()) >= 0.15, shares  # measured: 36% / 35% / 29%


def test_multi_hop_questions_go_to_costlier_tiers(router: Router, held_out: dict[str, np.ndarray]) -> None:
    """HotpotQA's multi-hop questions get a more expensive tier on average than SQuAD's single-passage ones."""
    cost = {name: np.mean([TIERS.index(t) for t in _tiers(router, v)]) for name, v in held_out.items()}
    print("mean tier index", cost)
    assert cost["hotpot"] - cost["squad"] >= 0.4, cost  # measured: 1.66 vs 0.87
    hotpot = _tiers(router, held_out["hotpot"])
    assert hotpot.count(Tier.HARD) / len(hotpot) >= 0.5  # measured: 55 / 70


# -- choose_tier (EdgeRAG's tier step): router on, off, overridden, missing -----------------------------
QUESTION = "Who founded the Harbourlight Science Museum?"


def test_router_on_routes_by_the_model(sample_rag: EdgeRAG, router: Router) -> None:
    vector = sample_rag.encoder.encode_one(QUESTION)
    answer = sample_rag.decide(QUESTION)
    assert answer.tier is router(vector) and not answer.tier_fallback
    assert answer.context_chars <= sample_rag.config.tier(answer.tier).context_chars


def test_router_off_uses_baseline_k_and_the_fallback_tier(sample_rag: EdgeRAG) -> None:
    c = Config(router=False, baseline_k=3)
    vector = sample_rag.encoder.encode_one(QUESTION)
    tier, spec, fallback = choose_tier(vector, sample_rag.router, c)
    base = c.tier(c.fallback_tier)
    assert (tier, fallback) == (c.fallback_tier, False)
    assert spec == TierSpec(3, base.context_chars, base.max_new_tokens, False)


@pytest.mark.parametrize("tier", TIERS)
def test_override_wins_over_the_router(sample_rag: EdgeRAG, tier: Tier) -> None:
    vector = sample_rag.encoder.encode_one(QUESTION)
    c = Config(tier_override=tier)
    assert choose_tier(vector, sample_rag.router, c) == (tier, c.tier(tier), False)


def test_missing_router_falls_back_and_says_so(bundle_dir: Path, tmp_path: Path) -> None:
    """A bundle without router.onnx: every question gets the config's fallback tier, recorded in the Answer."""
    assert choose_tier(np.zeros(384, np.float32), None, Config()) == (Tier.MEDIUM, Config().tier(Tier.MEDIUM), True)
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

