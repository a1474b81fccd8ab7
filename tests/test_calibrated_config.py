"""The Config a calibration recorded, read back as data and checked against the running one (no model needed)."""
from dataclasses import replace

import pytest

from edge_rag.config import Config, Tier
from edge_rag.decision.calibrated_config import (
    DECISION_INPUTS,
    ENCODER_IDENTITY,
    backend_change,
    config_change,
    encoder_change,
    generation_change,
    recorded_config,
)
from edge_rag.decision.certify import CALIBRATION_ASSET, PGVECTOR_CALIBRATION_ASSET, Calibration
from edge_rag.errors import ConfigError
from edge_rag.models import registry as M

SHIPPED = (CALIBRATION_ASSET, PGVECTOR_CALIBRATION_ASSET)  # one per kind of store


def test_a_recorded_config_reads_back_as_it_was():
    base = Config()
    for config in (base, base.with_(retrieval="dense", tier_override=Tier.HARD, lexical_weight=0.25, correction_threshold=-0.5),
                   base.with_(tiers={t: replace(s, k=s.k + 1) for t, s in base.tiers.items()}, fallback_tier="EASY")):
        assert recorded_config(repr(config)) == config


def test_a_field_the_record_lacks_takes_its_default_and_a_dropped_one_is_ignored():
    text = repr(Config(reader_window=2)).replace("lexical_budget=2000, ", "").replace("Config(", "Config(gone=1, ")
    assert recorded_config(text) == Config(reader_window=2)


@pytest.mark.parametrize("text", ["__import__('os').system('touch /tmp/edge-rag-pwned')", "Config(retrieval=open('x'))",
                                  "Config(reader_window=-1)", "Config(" + "[" * 5000, "Tiers({})", ""])
def test_anything_else_is_refused_unevaluated(text):
    with pytest.raises(ConfigError, match="not a recorded Config"):
        recorded_config(text)
    assert "cannot be read" in config_change({"config": text}, Config())


@pytest.mark.parametrize("asset", SHIPPED, ids=lambda p: p.name)
def test_the_shipped_calibrations_were_measured_with_the_default_decision_inputs(asset):
    then = recorded_config(Calibration.load(asset).source["config"])
    assert all(view(then) == view(Config()) for view in DECISION_INPUTS.values())
    assert config_change(Calibration.load(asset).source, Config()) is None


@pytest.mark.parametrize("asset", SHIPPED, ids=lambda p: p.name)
def test_the_shipped_calibrations_record_the_encoder_and_generator_make_models_builds(asset):
    """What `make models` puts in every profile's bundle is what the shipped files certify: the encoder of
    models.ENCODER, and generated answers of the gemma profile only (the tiny profile's SmolLM2 was not measured)."""
    cal = Calibration.load(asset)
    assert cal.source["encoder"] == {name: getattr(M.ENCODER, name) for name in ENCODER_IDENTITY}
    assert {r.gpt_generator for r in cal.readers.values()} == {M.PROFILES["gemma"].name}


@pytest.mark.parametrize("changes,named", [
    ({"retrieval": "dense"}, "retrieval: calibrated 'hybrid', now 'dense'"),
    ({"reader_window": 1, "reader_passages": 2}, "reader_passages: calibrated 1, now 2; reader_window: calibrated 2"),
    ({"lexical_weight": 0.8}, "lexical_weight"),
    ({"hnsw_ef_search": 200}, "hnsw_ef_search"),
    ({"passage_mode": "paragraph"}, "passage_mode: calibrated 'sentence', now 'paragraph'"),  # what a passage is
    ({"min_sentence_chars": 60}, "min_sentence_chars"),
    ({"hnsw_m": 4, "hnsw_ef_construction": 40}, "hnsw_m: calibrated 16, now 4; hnsw_ef_construction"),
    ({"gate_max_n": 40}, "search width"),  # the search keeps 40 hits: the top cosine and fused list are over them
    ({"reader": "rules", "rerank": False}, "rerank: calibrated True, now False"),  # the rule reader reads the context
    ({"reader": "rules", "tier_override": "HARD"}, "tier_override: calibrated None, now 'HARD'"),
])
def test_a_decision_input_changed_since_is_named_with_the_fix(changes, named):
    why = config_change({"config": repr(Config())}, Config(**changes))
    assert named in why and why.startswith("not calibrated for this Config") and "calibrate again" in why


@pytest.mark.parametrize("changes", [
    {"max_error_rate": 0.2, "delta": 0.1}, {"temperature": 0.9, "top_k": 5, "seed": 7}, {"threads": 1},
    {"memory_budget_mb": 900, "encode_batch_tokens": 512, "n_ctx": 2048}, {"cache_size": 0, "persistent_cache": True},
    {"tiers": {t: replace(s, max_new_tokens=8) for t, s in Config().tiers.items()}},  # generation only
    {"baseline_k": 8, "rerank": False, "router": False},  # the neural reader reads the search's hits, not the context
    {"gate": "none", "refuse_distance": 0.5, "rag_confidence": 0.9},
])
def test_what_does_not_change_the_scores_keeps_the_certificate(changes):
    assert config_change({"config": repr(Config())}, Config(**changes)) is None


def test_a_file_that_records_no_config_encoder_or_store_certifies_nothing(bundle):
    """An own calibration stripped of its records (by hand, or from an edge-rag before it kept them) certified any
    Config, encoder and kind of store: `Config(retrieval="dense")` answered at alpha 0.4, which the shipped file
    refuses. A count certifies only what it was measured on, and such a file does not say."""
    assert "records no Config" in config_change({"command": "edge-rag calibrate"}, Config(retrieval="dense"))
    assert "records no encoder" in encoder_change({"config": repr(Config())}, bundle)
    assert "records no kind of store" in backend_change({"config": repr(Config())}, remote=False)


@pytest.mark.parametrize("asset", SHIPPED, ids=lambda p: p.name)
def test_the_shipped_gpt_counts_hold_for_greedy_default_generation_only(asset):
    """The shipped GPT-route counts were generated greedily from the default tiers' contexts: they hold for
    Config(temperature=0), not for the default's sampling at 0.4, which is named."""
    source = Calibration.load(asset).source
    assert generation_change(source, Config(temperature=0.0)) is None
    why = generation_change(source, Config())
    assert why.startswith("generated answers are not certified under these generation settings (temperature: "
                          "calibrated 0.0, now 0.4; sampling (top_k, seed): calibrated None, now (50, 0)):")


@pytest.mark.parametrize("changes,named", [
    ({"tiers": {t: replace(s, max_new_tokens=8) for t, s in Config().tiers.items()}},
     "tiers (k, context_chars, max_new_tokens, rerank): calibrated [(1, 300, 64, False)"),
    ({"tiers": {**Config().tiers, Tier.HARD: replace(Config().tiers[Tier.HARD], context_chars=600)}}, "600, 128, True)]"),
    ({"compression_floor": 0.5}, "compression_floor: calibrated 0.3, now 0.5"),  # another context, another answer
    ({"router": False, "rerank": False}, "router: calibrated True, now False; rerank"),
    ({"repeat_ngram": 4}, "repeat_ngram"),
])
def test_a_generation_input_changed_since_is_named(changes, named):
    greedy = Config(temperature=0.0)
    why = generation_change({"config": repr(greedy)}, greedy.with_(**changes))
    assert named in why and "calibrate again" in why
    assert config_change({"config": repr(greedy)}, greedy.with_(**changes)) is None  # the reader's certificate stands


@pytest.mark.parametrize("changes", [
    {"top_k": 5, "seed": 7},  # greedy decoding samples nothing
    {"max_error_rate": 0.2, "threads": 1, "n_ctx": 2048, "reader_window": 1},  # the plan's n_ctx; the reader's inputs
])
def test_what_does_not_change_a_generated_answer_keeps_the_gpt_counts(changes):
    greedy = Config(temperature=0.0)
    assert generation_change({"config": repr(greedy)}, greedy.with_(**changes)) is None
    assert generation_change({"config": "not a Config"}, greedy) is None  # config_change refuses everything then
