"""Router (thesis §4.3): which budget tier a question needs, from what retrieval found.

``router.onnx`` is one small MLP exported by ``python -m convert router``; its logits are in
``config.TIERS`` order. ``features`` builds the row it is trained and run on: the query embedding
followed by the retrieval profile of the one search the pipeline makes — the cosine profile of the top
10 hits (s1, s1 - s5, score entropy: does one passage stand out?), how much of the question the best
of them cover (the compressor's term overlap, without the cosine prior, at the top 1 / 3 / 10 hits: is
the answer sentence likely among them?), and how much the top 3 / 10 hits cover together, from how many
documents, for a question of how many terms (does the question need more than one passage? issue #42:
without these a multi-hop question, whose first hop matches as strongly as a SQuAD answer sentence, read as
EASY), and whether the question reaches past the first hit's document (what the other documents among
the top 3 add, where the next document starts, the documents the question names by title: with 10 columns a
short multi-hop question still read as a SQuAD question of its length). The shipped router reads the profile
only: in cross-validation over 18 groups of training questions (SQuAD articles, HotpotQA buckets) the embedding
made it worse (it learns the topics of the training articles, not difficulty; edge_rag/assets/router_report.md).
Routers of older bundles read the embedding (384 wide), embedding and the 6-column profile (390) or that
profile alone (6), or the 10-column profile (issue #42's first): ``Router`` gives each the columns of its width.
Training (convert/train_router.py) calls the same ``features`` on the same search, so the router sees at run
time exactly what it was trained on.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..config import TIERS, Config, Tier, TierSpec
from ..errors import BundleError
from ..types import Passage
from .compress import terms_of, weigh_terms
from .encode import load_session

# input order after the embedding; a router reads the first columns of it that it was trained on (``columns``)
PROFILE = ("s1", "s1-s5", "entropy", "overlap@1", "overlap@3", "overlap@10",  # the routers of before issue #42
           "union@3", "union@10", "docs@3", "terms",  # issue #42's first router
           "rest@3", "next-doc", "next-gap", "named@3", "named@10", "docs@10")
PROFILE_K = 10  # top hits the profile reads (the search returns at least this many: search_width)
PROFILE_TEMPERATURE = 0.05  # softmax temperature over cosines: gaps of a few hundredths decide the entropy
PROFILE_MEMO = 8  # profiles remembered: a question's router and its certified score read the same one


def profile(question: str, hits: Sequence[Passage]) -> np.ndarray:
    """s1, s1 - s5, the entropy of softmax(top-10 cosines / T) divided by ln 10 (1 = flat, 0 = one hit
    stands out), then the best term overlap of a sentence of the top 1 / 3 / 10 hits with the question;
    then what one sentence cannot show: the share of the question's terms the top 3 / 10 hits hold together
    (a multi-hop question's terms are split over two documents: its best sentence matches the first hop as
    strongly as a SQuAD answer sentence matches its question, but leaves the rest to another document), the
    number of documents among the top 3 hits, and the question's number of terms; then ``hops`` (issue #42,
    second round). Fewer hits than 5 use the last one; no hits (no retrieval, empty store) = zeros. Overlaps
    are shares of the question, weighted by rarity among the candidates: the same on any corpus the hits
    come from. Remembered for the last few (question, top hits): the router and the certified score
    (read.Candidate.features) of one question read the same profile, which costs ~0.3 ms."""
    return _profile(question, tuple(hits[:PROFILE_K])).copy()


@functools.lru_cache(maxsize=PROFILE_MEMO)
def _profile(question: str, top: tuple[Passage, ...]) -> np.ndarray:
    if not top:
        return np.zeros(len(PROFILE), np.float32)
    s = np.array([p.score for p in top], dtype=np.float64)
    p = np.exp((s - s.max()) / PROFILE_TEMPERATURE)
    p /= p.sum()
    entropy = -float(np.sum(p * np.log(np.maximum(p, 1e-12)))) / np.log(PROFILE_K)
    terms = weigh_terms(question, top)
    overlap = [0.0] * len(top)  # best sentence of each hit
    found: list[set[str]] = [set() for _ in top]  # every term of each hit
    for rank, _, _, sentence, _ in terms.units:
        overlap[rank] = max(overlap[rank], terms.share(sentence))
        found[rank] |= sentence
    best = [max(overlap[:n]) for n in (1, 3, PROFILE_K)]
    union = [terms.share(set().union(*found[:n])) for n in (3, PROFILE_K)]
    docs = len({h.doc_id for h in top[:3]})
    return np.array([s[0], s[0] - s[min(4, len(s) - 1)], entropy, *best, *union, docs, len(terms.question),
                     *hops(top, terms.question, found, terms.share)], np.float32)


def hops(top: Sequence[Passage], question: set[str], found: list[set[str]], share: Callable[[set[str]], float]
         ) -> list[float]:
    """Whether the question reaches past the first hit's document (issue #42: the 10-column profile still sent
    a short multi-hop question to k = 1, as a SQuAD question of its length): the share of the question that the
    other documents among the top 3 hits add to the first's; where the next document starts (its rank / 10, 1
    if none) and how far its cosine lies below s1 (below 0 where the hybrid order put a weaker cosine first);
    the documents among the top 3 / 10 whose title shares a term with the question (a question that names two
    documents needs both); the documents among the top 10."""
    first = top[0].doc_id
    near = range(min(3, len(top)))
    own = set().union(*(found[i] for i in near if top[i].doc_id == first))
    other = set().union(*(found[i] for i in near if top[i].doc_id != first))
    nxt = next((i for i, h in enumerate(top) if h.doc_id != first), PROFILE_K)
    gap = top[0].score - top[min(nxt, len(top) - 1)].score
    named = [len({h.doc_id for h in top[:n] if terms_of(h.title) & question}) for n in (3, PROFILE_K)]
    return [share(other - own), nxt / PROFILE_K, gap, *named, len({h.doc_id for h in top})]


def features(vector: np.ndarray, question: str, hits: Sequence[Passage]) -> np.ndarray:
    """The router's input row: the query embedding, then ``profile(question, hits)``."""
    return np.concatenate([np.asarray(vector, np.float32).ravel(), profile(question, hits)])


def search_width(config: Config) -> int:
    """Passages one search fetches: enough for any tier plus correction, the gate, and the profile."""
    c = config
    most = max([c.baseline_k] + [c.tier(t).k for t in TIERS])
    return max(most + c.correction_extra_k, c.gate_max_n, PROFILE_K)


def columns(width: int, row_width: int) -> slice:
    """The columns of a ``features`` row (``row_width`` wide) that a router with ``width`` inputs reads: the
    first ``width`` of the profile (all of it, or the 6 of the profile-only router before issue #42), else the
    leading ``width`` — the embedding (384) or the embedding and 6-column profile (390) of older routers. A row
    no wider than the router is read whole (rows cut to its columns already)."""
    if width >= row_width:
        return slice(0, width)
    start = row_width - len(PROFILE)
    return slice(start, start + width) if width <= len(PROFILE) else slice(0, width)


class Router:
    def __init__(self, onnx_path: str | Path, threads: int = 1) -> None:
        self.session = load_session(Path(onnx_path), threads)
        rows, logits = self.session.get_inputs()[0], self.session.get_outputs()[0].shape
        if len(rows.shape) != 2 or not isinstance(rows.shape[1], int) or logits[-1] != len(TIERS):
            raise BundleError(f"{onnx_path} is not a tier router: input {rows.shape}, output {logits}")
        self.input, self.width = rows.name, rows.shape[1]

    def logits(self, rows: np.ndarray) -> np.ndarray:
        """Logits of ``features`` rows (batch, embedding + profile); the model gets the columns it reads."""
        rows = np.atleast_2d(rows).astype(np.float32)
        return self.session.run(None, {self.input: rows[:, columns(self.width, rows.shape[1])]})[0]

    def __call__(self, vector: np.ndarray, question: str = "", hits: Sequence[Passage] = ()) -> Tier:
        return TIERS[int(np.argmax(self.logits(features(vector, question, hits))[0]))]


def choose_tier(vector: np.ndarray, question: str, hits: Sequence[Passage], router: Router | None,
                config: Config) -> tuple[Tier, TierSpec, bool]:
    """The tier, its budget, and whether it is a fallback. The router decides unless a tier is forced
    (tier_override: also with the router off, whose "always HARD" kiosk got the fallback tier's budget), it is
    switched off (the fixed-k baseline: k = baseline_k, other limits as the fallback tier, no rerank), or the
    bundle has no router (the config's fallback tier, recorded as such)."""
    c = config
    if c.tier_override is not None:
        return c.tier_override, c.tier(c.tier_override), False
    if not c.router:
        base = c.tier(c.fallback_tier)
        return c.fallback_tier, TierSpec(c.baseline_k, base.context_chars, base.max_new_tokens, False), False
    if router is None:
        return c.fallback_tier, c.tier(c.fallback_tier), True
    tier = router(vector, question, hits)
    return tier, c.tier(tier), False


def correct(hits: list[Passage], k: int, tier: Tier, config: Config) -> tuple[list[Passage], bool]:
    """Thesis correction: a weak best match (s_1 < threshold) on a non-HARD tier gets k_extra more passages."""
    weak = bool(hits) and hits[0].score < config.correction_threshold
    if config.correction and weak and tier is not Tier.HARD:
        return hits[: k + config.correction_extra_k], True
    return hits[:k], False
