"""``rag.ask_stream`` and ``Generator.stream``: the streamed events are the ones ``ask`` is built from."""
from __future__ import annotations

from dataclasses import replace

from conftest import SAMPLE_DOCS

from edge_rag import Config, EdgeRAG
from edge_rag.config import DEFAULT_TIERS, Tiers
from edge_rag.events import Final, RouteDecided, Token
from edge_rag.reading.generate import Generation
from edge_rag.types import Route


def test_extractive_and_refused_questions_stream_route_then_answer(sample_rag):
    for question, route in (("Who founded the Harbourlight Science Museum?", Route.RAG),
                            ("How do I bake sourdough bread?", Route.REFUSE)):
        events = list(sample_rag.ask_stream(question))
        assert [type(e) for e in events] == [RouteDecided, Final]  # no Token: nothing is generated
        assert events[0].route is route is events[1].answer.route
        again = list(sample_rag.ask_stream(question))  # now from the answer cache
        assert again[0].cache_hit and again[1].answer.answer == events[1].answer.answer
        assert sample_rag.ask(question).answer == events[1].answer.answer


def test_stream_pieces_add_up_to_the_generation(bundle_dir, tmp_path):
    """``stream`` and ``generate`` share one decoding loop: same result; the pieces add up to the text. (On the seeds'
    decision, which plans llama.cpp: the certified default never generates.)"""
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(temperature=0.0, cgr=False)) as rag:
        rag.add_files([SAMPLE_DOCS / "16-little-sparks.md"])
        decision = rag.decide("What can children do at the museum?")
        gen = rag.generator
    out = list(gen.stream(decision.question, decision.context, max_new_tokens=10, temperature=0.0))
    *pieces, result = out
    assert isinstance(result, Generation) and all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == result.text
    assert 0 < result.completion_tokens <= 10
    again = gen.generate(decision.question, decision.context, max_new_tokens=10, temperature=0.0)
    assert again == result



def test_an_answer_cut_before_its_first_sentence_ends_is_refused_and_never_streamed(bundle_dir, tmp_path):
    """A fragment is no answer: with a budget too small for one sentence the GPT route refuses saying why,
    and the page (which shows the streamed pieces until the answer event) was sent none of it."""
    budget = 4
    tiers = Tiers({t: replace(s, max_new_tokens=budget) for t, s in DEFAULT_TIERS.items()})
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(temperature=0.0, cgr=False, tiers=tiers)) as rag:
        rag.add_files([SAMPLE_DOCS / "10-engine-hall-big-mary.md"])
        events = list(rag.ask_stream("Describe Big Mary and what she did."))
    answer = events[-1].answer
    assert events[0].route is Route.GPT and answer.completion_tokens == budget
    assert answer.route is Route.REFUSE and answer.answer is None and not answer.confident
    assert answer.refusal_reason.startswith("the generated answer was cut off")
    assert not [e for e in events if isinstance(e, Token)]
