"""Whether a calibration was measured under the running Config, the bundle's encoder and the store's passages.

A calibration's risk table counts the errors among the answers one Config's decision gave at each score. Under
another search or reading setting the same question gets other passages, another candidate and another score, and
the table says nothing about those: the certificate would silently not apply. Calibration files record the Config
they were measured with (``repr(config)`` in "source": ``edge-rag calibrate`` and ``python -m convert
calibrate`` both write it); this module reads it back as data, never evaluating it, and names what differs. They
record the encoder that made the vectors too ("encoder": ``encoder_identity``): another encoder model gives every
cosine, the fused list, the out-of-domain distance and so the score another meaning. And a store records how its
passages were cut (passage_kinds.py), which ``store_change`` compares with what the calibration measured. The
GPT route's counts hold only for answers generated as they were (``generation_change``).
"""
from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable
from dataclasses import fields
from enum import Enum
from typing import Any

from ..config import Config, TierSpec
from ..errors import ConfigError
from ..models.bundle import Bundle
from ..retrieval.route import search_width
from ..storage.passage_kinds import kind_of


def _field(name: str, rules_only: bool = False) -> Callable[[Config], object]:
    """A Config field as the decision sees it; ``rules_only``: read only by the rule reader (None otherwise)."""
    return lambda c: getattr(c, name) if c.reader == "rules" or not rules_only else None


# What the certified decision sees of the Config (pipeline._decide, CertifiedPath.read and .decide): a calibration
# measured under other values counted other candidates and scores. passage_mode and min_sentence_chars decide what a
# passage is (a paragraph's vector and words against a sentence's with its neighbours'): the Config that asks is the
# one that indexed, as a rule. retrieval, fusion_k, lexical_weight, lexical_budget, hnsw_ef_search and the graph's
# build settings hnsw_m and hnsw_ef_construction decide which passages the search returns (a sparser graph misses
# more of the exact top 20); max_seq_len the question's vector (so
# every cosine, the top cosine feature and the out-of-domain distance); the search width how many hits it keeps (the
# fused list and the top cosine are taken over them: route.search_width of baseline_k, the tiers' k,
# correction_extra_k and gate_max_n); reader_passages and reader_window what the neural reader reads. The rule
# reader (reader="rules") reads the tier's compressed context instead, so for it the stages that shape that context
# count too. Not here, as the scores do not depend on them: the certificate asked for (max_error_rate, delta),
# generation (temperature, top_k, n_ctx, tiers' max_new_tokens, ...: GENERATION_INPUTS below), resources (threads,
# memory_budget_mb; encode_batch_tokens, which the memory plan sets), the cache, the seeds' gate and thresholds. A
# store indexed under another Config than the asking one's is checked by the kinds of passages it recorded
# (store_change). The reader is matched by the calibration's entry for it, its model by sha256
# (certified.stale_reader).
# What picks the tier and builds its compressed context: read by the rule reader and by the generator.
CONTEXT_INPUTS = ("router", "tier_override", "fallback_tier", "baseline_k", "correction", "correction_threshold",
                  "correction_extra_k", "rerank", "rerank_dense_weight", "rerank_lexical_weight", "rerank_title_weight",
                  "compression", "compression_floor", "dedupe_prefix_chars")
DECISION_INPUTS: dict[str, Callable[[Config], object]] = {
    **{name: _field(name) for name in (
        "passage_mode", "min_sentence_chars", "retrieval", "fusion_k", "lexical_weight", "lexical_budget",
        "hnsw_m", "hnsw_ef_construction", "hnsw_ef_search", "max_seq_len", "reader_passages", "reader_window")},
    "search width (baseline_k, tiers' k, correction_extra_k, gate_max_n)": search_width,
    **{name: _field(name, rules_only=True) for name in CONTEXT_INPUTS},
    "tiers' k, context_chars, rerank": lambda c: ([(s.k, s.context_chars, s.rerank) for s in c.tiers.values()]
                                                  if c.reader == "rules" else None),
}
# What a generated answer depends on besides the decision's inputs: the tier, its passages and the compressed context
# the generator reads (router, correction, rerank, compression and the tiers' budgets), and the decoding. The GPT
# route's calibration counts answers generated under these (convert/calibrate.py, greedy), and certifies only
# those: sampled at another temperature, or from other contexts, the generator makes other mistakes. Sampling's
# top_k and seed do not matter at temperature 0. Not here: n_ctx, which the memory plan sizes (a context that does
# not fit is shortened, generate.py), and the generator model, which the calibration's entry names.
GENERATION_INPUTS: dict[str, Callable[[Config], object]] = {
    **{name: _field(name) for name in (*CONTEXT_INPUTS, "temperature", "repeat_ngram", "repeat_window")},
    "tiers (k, context_chars, max_new_tokens, rerank)": lambda c: [
        (s.k, s.context_chars, s.max_new_tokens, s.rerank) for s in c.tiers.values()],
    "sampling (top_k, seed)": lambda c: (c.top_k, c.seed) if c.temperature > 0 else None,
}
# The encoder facts that decide its vectors. Not its precision: the int8 export is checked against the fp32 model
# when the bundle is built (cosine >= 0.98 per sentence, bundle "parity"), and a CPU where int8 fails that check gets
# the fp32 twin; the two differ by about what two CPUs' int8 kernels do, which no certificate pins either.
ENCODER_IDENTITY = ("name", "dim", "pooling", "normalize")
UNRECORDED = " (a file made by hand, or by an edge-rag before it recorded it)"  # such a file certifies nothing
_ENUM = re.compile(r"<\w+\.\w+: ('[^'<>]*'|-?\d+)>")  # an Enum member's repr, <Tier.EASY: 'EASY'>: its value


@functools.lru_cache(maxsize=16)  # read by the Config check and again by the store check, per open
def recorded_config(text: str) -> Config:
    """The Config whose ``repr`` is ``text``, read as data. A field the text lacks was added to Config after it was
    written and takes its default (a new field's default keeps the behaviour from before it: the shipped calibration
    predates ``lexical_budget`` and ran with its default 2,000, then a constant); a field Config no longer has is
    dropped. ConfigError when ``text`` is no such repr."""
    try:
        call = ast.parse(_ENUM.sub(r"\1", text), mode="eval").body
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Config"):
            raise ValueError("not Config(...)")
        known = {f.name for f in fields(Config)}
        return Config(**{kw.arg: _value(kw.value) for kw in call.keywords if kw.arg is not None and kw.arg in known})
    except (SyntaxError, ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(f"{text[:60]!r}… is not a recorded Config ({exc})") from None


def _value(node: ast.expr | None) -> Any:
    """A field's value: a literal, or the tiers (``Tiers({'EASY': TierSpec(k=1, ...), ...})``) as a dict. A ``**``
    entry (no key: None) is no such value."""
    if node is None:
        raise ValueError("a ** entry")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "TierSpec" and not node.args:
            return TierSpec(**{_keyword(kw): ast.literal_eval(kw.value) for kw in node.keywords})
        if node.func.id == "Tiers" and len(node.args) == 1 and isinstance(node.args[0], ast.Dict):
            return {_value(k): _value(v) for k, v in zip(node.args[0].keys, node.args[0].values)}
    return ast.literal_eval(node)


def _keyword(kw: ast.keyword) -> str:
    if kw.arg is None:
        raise ValueError("a ** argument")
    return kw.arg


def _shown(value: object) -> object:
    """A Tier as its name, anything else as it is."""
    return value.value if isinstance(value, Enum) else value


def _changed(source: dict, config: Config, inputs: dict[str, Callable[[Config], object]]) -> list[str] | None:
    """Each of ``inputs`` whose value under ``config`` differs from the Config ``source`` recorded; ConfigError when
    it records none or the record cannot be read."""
    text = source.get("config")
    if text is None:
        raise ConfigError("it records none")
    then = recorded_config(text).with_(reader=config.reader)  # each reader's entry was measured with that reader
    return [f"{name}: calibrated {_shown(view(then))!r}, now {_shown(view(config))!r}"
            for name, view in inputs.items() if view(then) != view(config)]


def config_change(source: dict, config: Config) -> str | None:
    """Why a calibration whose "source" is ``source`` does not certify ``config``: the decision inputs that differ
    from the Config it recorded (None: none differ). A file that records no Config (made by hand, or by an
    ``edge-rag calibrate`` before it recorded one) certifies nothing: its counts may be of any Config (one certified
    `Config(retrieval="dense")`, which the shipped file refuses)."""
    fix = "calibrate again with this Config (`edge-rag calibrate`), or run with the calibrated values"
    if source.get("config") is None:
        return f"the calibration records no Config it was measured with{UNRECORDED}: {fix}"
    try:
        changed = _changed(source, config, DECISION_INPUTS)
    except ConfigError as exc:
        return f"the Config the calibration was measured with cannot be read ({exc}): {fix}"
    return f"not calibrated for this Config ({'; '.join(changed)}): {fix}" if changed else None


def generation_change(source: dict, config: Config) -> str | None:
    """Why the GPT-route counts of a calibration whose "source" is ``source`` do not certify answers generated under
    ``config``: the generation inputs that differ from the Config it recorded (None: none differ; a missing or
    unreadable record certifies nothing at all, as config_change says)."""
    try:
        changed = _changed(source, config, GENERATION_INPUTS)
    except ConfigError:
        return None
    return (f"generated answers are not certified under these generation settings ({'; '.join(changed)}): the "
            "calibration counted answers generated under its own; run with those, or calibrate again (`python -m "
            "convert calibrate`)" if changed else None)


def encoder_identity(bundle: Bundle) -> dict[str, object]:
    """What a calibration records of the encoder it measured with (ENCODER_IDENTITY of the bundle's manifest)."""
    return {name: bundle.encoder.get(name) for name in ENCODER_IDENTITY}


def encoder_change(source: dict, bundle: Bundle) -> str | None:
    """Why a calibration whose "source" is ``source`` does not certify ``bundle``'s encoder (None: the same model;
    a file that records none certifies nothing: its scores may be of any encoder)."""
    then = source.get("encoder")
    if then is None:
        return f"the calibration records no encoder it was measured with{UNRECORDED}: calibrate again"
    if not isinstance(then, dict):  # an own calibration file is the user's: anything may be in it
        return f"the encoder the calibration was measured with cannot be read ({then!r:.60}): calibrate again"
    now = encoder_identity(bundle)
    changed = [f"{name}: calibrated {then.get(name)!r}, now {now[name]!r}" for name in ENCODER_IDENTITY
               if then.get(name) != now[name]]
    return (f"not calibrated for this bundle's encoder ({'; '.join(changed)}): calibrate again with this bundle "
            "(`edge-rag calibrate`), or use the bundle it was calibrated with" if changed else None)


def backend(remote: bool) -> str:
    """The kind of store a calibration records it measured on ("backend"): a PostgreSQL store, or the embedded one."""
    return "pgvector" if remote else "embedded"


def backend_change(source: dict, remote: bool) -> str | None:
    """Why a calibration whose "source" is ``source`` does not certify a store of this kind (``remote``: PostgreSQL;
    None: the kind it measured; a file that records none certifies neither): a PostgreSQL store ranks its full-text half by
    ts_rank_cd, not BM25, so its fused lists, candidates and scores differ (245 of 865 SQuAD test decisions under one
    calibration: benchmarks.backend_parity), and a count made on one kind says nothing of the other's."""
    then, now = source.get("backend"), backend(remote)
    if then is None:
        return f"the calibration records no kind of store it was measured on{UNRECORDED}: calibrate again on this store"
    if then == now:
        return None
    return (f"not calibrated for this kind of store (calibrated on a {str(then)[:40]!r} store, this one is {now}): "
            "use the shipped calibration of its kind, or calibrate again on this store (`edge-rag calibrate`)")


def store_change(source: dict, kinds: frozenset[str]) -> str | None:
    """Why a calibration whose "source" is ``source`` does not certify a store whose passages are of ``kinds``
    (passage_kinds.py; None: all of a kind it measured, or either side unknown). The Config check sees how the
    running Config would cut new documents; this one, how the store's were cut, perhaps under another Config. A
    calibration records the kinds of the store it measured ("passages", ``edge-rag calibrate``), else its Config's."""
    measured = source.get("passages")
    if measured is None and isinstance(source.get("config"), str):
        try:
            measured = [kind_of(recorded_config(source["config"]))]
        except ConfigError:
            return None  # config_change says the record cannot be read
    if not kinds or not isinstance(measured, list):
        return None
    other = sorted(kinds - set(measured))
    return (f"not calibrated for this store's passages (cut as {', '.join(other)}; the calibration measured "
            f"{', '.join(map(str, measured))}, as passage_mode:min_sentence_chars): re-index the documents with the "
            "calibrated Config, or calibrate again on this store (`edge-rag calibrate`)" if other else None)
