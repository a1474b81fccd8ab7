"""``rag.ask_stream`` and ``Generator.stream``: the streamed events are the ones ``ask`` is built from."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from conftest import SAMPLE_DOCS, sample_store

from edge_rag import Config, EdgeRAG
from edge_rag.config import DEFAULT_TIERS, Tiers
from edge_rag.events import Event, EventStream, Final, RouteDecided, Token
from edge_rag.reading.generate import Generation
from edge_rag.types import Answer, Route


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


def test_a_generation_with_no_text_is_refused_saying_so(bundle_dir, tmp_path):
    """Asked "... Answer:", Gemma writes a newline first, and the answer (its first line) is empty: the Answer was a
    GPT route with no answer and no reason, which the kiosk showed as "not in the documents" (6 of 24 GPT-route
    questions of the sample corpus with "Answer:" or "Context:" appended)."""
    config = Config(temperature=0.0, certified=False)
    with EdgeRAG(sample_store(bundle_dir, tmp_path / "db"), bundle=bundle_dir, config=config) as rag:
        events = list(rag.ask_stream("Tell me about the planetarium Answer:"))
    answer = events[-1].answer
    assert events[0].route is Route.GPT and answer.completion_tokens > 0
    assert answer.route is Route.REFUSE and answer.answer is None and not answer.confident
    assert answer.refusal_reason.startswith("the generator gave no answer")
    assert not [e for e in events if isinstance(e, Token)]


# At 24 tokens this GPT-route question's first sentence ends mid-answer: its stream pauses while llama.cpp is decoding.
PAUSED, OTHER = "Describe Margaret Hollins and her life.", "Describe the harbour."
WAIT_S = 120  # an answer takes seconds here; before the fix the other ask waited forever


def _ask_while_paused(rag: EdgeRAG, same_thread: bool) -> tuple[EventStream, list[Event], list[Answer]]:
    """Take PAUSED's route and first sentence, then ask OTHER (on this thread or another) with that stream left
    unread. Bounded: if OTHER is not answered within WAIT_S the stream is closed (which frees a stuck ask)."""
    streams: list[EventStream] = []
    events: list[Event] = []
    answers: list[Answer] = []

    def pause() -> None:
        streams.append(stream := rag.ask_stream(PAUSED))
        events.extend([next(stream), next(stream)])

    def ask() -> None:
        if same_thread:
            pause()
        answers.append(rag.ask(OTHER))

    if not same_thread:
        pause()
    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(WAIT_S)
    if worker.is_alive():
        streams[0].close()
        worker.join(WAIT_S)
        pytest.fail(f"a GPT-route ask waited over {WAIT_S} s for a paused stream ({'same' if same_thread else 'other'}"
                    " thread)")
    return streams[0], events, answers


@pytest.mark.parametrize("same_thread", [False, True], ids=["other-thread", "same-thread"])
def test_a_paused_stream_holds_no_other_question_up(sample_rag, bundle_dir, same_thread):
    """A caller that took a sentence and paused (or kept the stream unread) held llama.cpp's lock: every other
    GPT-route question waited forever, and the next ask on its own thread deadlocked. Now the other question is
    answered as if alone, and the paused stream can still be read to the same answer, or closed."""
    tiers = Tiers({t: replace(s, max_new_tokens=24) for t, s in DEFAULT_TIERS.items()})
    config = Config(temperature=0.0, certified=False, cache_size=0, tiers=tiers)
    with EdgeRAG(sample_rag.store.folder, bundle=bundle_dir, config=config, create=False) as rag:
        assert rag.decide(PAUSED).route is rag.decide(OTHER).route is Route.GPT
        expected = {q: rag.ask(q).answer for q in (PAUSED, OTHER)}
        stream, events, answers = _ask_while_paused(rag, same_thread)
        assert isinstance(events[0], RouteDecided) and isinstance(events[1], Token)
        assert [a.answer for a in answers] == [expected[OTHER]]
        if same_thread:
            stream.close()
            assert rag.ask(PAUSED).answer == expected[PAUSED]
        else:
            *_, final = stream
            assert isinstance(final, Final) and final.answer.answer == expected[PAUSED]
            assert final.answer.answer.startswith(events[1].text)
