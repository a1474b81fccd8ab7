"""The reader's training examples (convert/reader_data.py) on the real SQuAD-2 train articles: gold spans land
on the answer's tokens, and swapped questions really lose their answer in the paragraph."""
from __future__ import annotations

import argparse
import functools
import json
import random

import pytest
from tokenizers import Tokenizer

from benchmarks.splits import SPLITS_FILE
from convert import reader_data as D
from edge_rag.models import bundle as B
from edge_rag.reading.reader import CONTEXT_SEQUENCE, Windows, passage_context

pytestmark = pytest.mark.skipif(not D.SQUAD_TRAIN.is_file(), reason=f"{D.SQUAD_TRAIN} not found (../shared/data)")


@pytest.fixture(scope="module", autouse=True)
def _each_file_parsed_once():
    """D.squad_questions, memoised for this module: the selection tests read SQuAD 1.1 train (30 MB) and the recovered
    SQuAD-2 train (19 MB) through reader_train, reader_select and calibrate.selection_file, 14 parses of 4 read-only
    files (~16 s of CPU) where 4 give the same questions; every function under test still runs on them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(D, "squad_questions", functools.lru_cache(maxsize=None)(D.squad_questions))
        yield


@pytest.fixture(scope="module")
def questions() -> list[D.Question]:
    return D.squad_questions(D.SQUAD_TRAIN, None)


@pytest.fixture(scope="module")
def windows(bundle_dir) -> Windows:
    return Windows(Tokenizer.from_file(str(B.Bundle.load(bundle_dir).require(B.ROLE_TOKENIZER))), 256, 128)


def test_gold_labels_cover_the_answer_text(questions: list[D.Question], windows: Windows):
    answerable = [q for q in questions if q.answer_start >= 0][:200]
    for q in answerable:
        text, prefix = passage_context(q.title, q.context)
        labelled = [(ids, s, e) for ids, _, s, e in
                    D.label_windows(windows, q.question, q.title, q.context, q.answer_start, q.answers[0]) if s]
        assert labelled, q.id  # the answer is inside at least one window
        for ws in windows(q.question, text):
            if ws.ids == labelled[0][0]:
                _, s, e = labelled[0]
                assert ws.sequence_ids[s] == ws.sequence_ids[e] == CONTEXT_SEQUENCE
                span = text[ws.offsets[s][0]:ws.offsets[e][1]]
                assert q.answers[0].strip().lower() in span.lower() and len(span) <= len(q.answers[0]) + 20, (q.id, span)


def test_swapped_questions_change_one_name_or_number_to_one_absent_from_the_paragraph(questions: list[D.Question]):
    by_article: dict[str, list[str]] = {}
    for q in questions:
        if q.context not in by_article.setdefault(q.article, []):
            by_article[q.article].append(q.context)
    rng, swapped, tried = random.Random(0), 0, 0
    for q in questions:
        if q.answer_start < 0 or tried >= 400:
            continue
        tried += 1
        new = D.swap_question(q.question, q.context, " ".join(by_article[q.article]), rng)
        if new is None:
            continue
        swapped += 1
        old_spans = set(D._SWAPPABLE.findall(q.question))
        added = [s for s in D._SWAPPABLE.findall(new) if s not in old_spans]
        assert new != q.question and added, (q.question, new)
        assert any(s.lower() not in q.context.lower() for s in added), (q.question, new)
    assert swapped > tried // 3  # most answerable SQuAD questions name something their paragraph names


def test_build_examples_mix_and_determinism(questions: list[D.Question], windows: Windows):
    part = questions[:300]
    a = D.build_examples(windows, part, 0.3, seed=0, swaps_per_answerable=0.5)
    b = D.build_examples(windows, part, 0.3, seed=0, swaps_per_answerable=0.5)
    assert [(e.ids, e.start, e.end, e.source) for e in a] == [(e.ids, e.start, e.end, e.source) for e in b]
    sources = {e.source for e in a}
    assert {"answerable", "swapped"} <= sources
    assert all(e.start == e.end == 0 for e in a if e.source in ("swapped", "impossible", "same_article",
                                                                   "other_article", "window"))
    assert all(0 < e.start <= e.end for e in a if e.source == "answerable")
    # swaps draw from their own random stream: turning them off leaves every other example as it was
    plain = D.build_examples(windows, part, 0.3, seed=0)
    assert [e.ids for e in plain] == [e.ids for e in a if e.source != "swapped"]


def test_a_source_mix_sets_the_share_of_each_source_and_repeats_scarce_ones():
    examples = [D.Example([i], [0], 0, 0, "impossible") for i in range(3)] + [
        D.Example([i], [0], 1, 1, "answerable") for i in range(100)]
    mix = D.source_mix("impossible=0.4,answerable=0.6")
    picked = D.mixed(examples, mix, 20, random.Random(0))
    impossible = [e for e in picked if e.source == "impossible"]
    assert len(picked) == 20 and len(impossible) == 8 and {e.ids[0] for e in impossible} == {0, 1, 2}
    assert len({e.ids[0] for e in picked if e.source == "answerable"}) == 12  # plentiful: no repeats
    for bad in ("impossible=0.5", "impossible=1.5,answerable=-0.5", "impossible"):
        with pytest.raises(argparse.ArgumentTypeError):
            D.source_mix(bad)
    with pytest.raises(ValueError, match="no 'swapped' examples"):
        D.mixed(examples, {"swapped": 1.0}, 5, random.Random(0))


def test_a_second_stage_skips_exactly_the_windows_the_first_stage_trained_on():
    examples = [D.Example([i], [0], 0, 0, "answerable") for i in range(500)]
    first, rest = D.seeded_subset(examples, 300, seed=0)
    assert first == random.Random(0).sample(examples, 300)  # how stage-one runs drew their subset before this helper
    assert len(rest) == 200 and {e.ids[0] for e in first}.isdisjoint(e.ids[0] for e in rest)
    assert [e.ids[0] for e in rest] == sorted(e.ids[0] for e in rest)  # the rest keeps the data's order


@pytest.mark.skipif(not D.SQUAD2_RECOVERED.is_file(), reason=f"{D.SQUAD2_RECOVERED} not found (../shared/data)")
def test_the_model_selection_articles_are_in_no_training_source():
    train, select = D.reader_train(), D.reader_select(None)
    held = {q.context for q in select}
    assert not held & {q.context for q in train}  # not a paragraph of theirs, from either file
    assert not {q.id for q in select} & {q.id for q in train}
    kinds = {k: sum((q.answer_start >= 0) == (k == "answerable") for q in select) for k in ("answerable", "impossible")}
    assert kinds["answerable"] > 2000 and kinds["impossible"] > 1000
    recovered = [q for q in train if q.answer_start < 0 and q.plausible]
    assert len(recovered) > 15000  # the recovered real unanswerables train, less the held-out articles'


@pytest.mark.skipif(not D.SQUAD2_RECOVERED.is_file(), reason=f"{D.SQUAD2_RECOVERED} not found (../shared/data)")
def test_no_reported_question_is_on_an_article_or_paragraph_the_reader_learnt_or_was_chosen_on():
    """The test split's figures and the calibration split's counts hold only for paragraphs the reader never saw:
    none of theirs is in its training, validation or model-selection sources (SQuAD 1.1 and SQuAD 2.0 share
    paragraphs under other ids and titles, so paragraphs are compared by text, not only articles by title)."""
    seen = D.reader_train() + D.reader_val() + D.reader_select(None)
    parts = json.loads(SPLITS_FILE.read_text(encoding="utf-8"))
    for part in ("test", "calibration"):
        reported = (D.squad_questions(D.SQUAD_DEV, tuple(parts["squad"][part]))
                    + D.hotpot_questions(D.HOTPOT, tuple(parts["hotpotqa"][part])))
        assert len(reported) > 400, part
        assert not {q.context for q in reported} & {q.context for q in seen}, part
        assert not {q.article for q in reported if q.source == "squad"} & {q.article for q in seen}, part
        assert not {q.id for q in reported} & {q.id for q in seen}, part


@pytest.mark.skipif(not D.SQUAD2_RECOVERED.is_file(), reason=f"{D.SQUAD2_RECOVERED} not found (../shared/data)")
def test_an_unanswerable_window_carries_its_plausible_span_as_a_hard_negative(windows: Windows):
    unanswerable = [q for q in D.squad_questions(D.SQUAD2_RECOVERED, None) if q.plausible][:150]
    examples = D.build_examples(windows, unanswerable, 0.0, seed=0)
    marked = [e for e in examples if e.plausible_start]
    assert all(e.source == "impossible" and e.start == e.end == 0 for e in examples)  # the label stays [CLS]
    assert len(marked) >= 0.9 * len(unanswerable)  # one window per question holds its plausible span
    by_ids = {tuple(e.ids): e for e in marked}
    for q in unanswerable:
        text, _ = passage_context(q.title, q.context)
        for w in windows(q.question, text):
            e = by_ids.get(tuple(w.ids))
            if e is not None:
                span = text[w.offsets[e.plausible_start][0]:w.offsets[e.plausible_end][1]]
                assert q.plausible.strip().lower() in span.lower(), (q.id, span)


@pytest.mark.skipif(not D.SQUAD2_RECOVERED.is_file(), reason=f"{D.SQUAD2_RECOVERED} not found (../shared/data)")
def test_the_selection_store_holds_its_articles_whole_and_asks_its_questions_on_their_own_paragraphs(tmp_path):
    from convert.calibrate import selection_file
    from evaluation.datasets import load_squad

    path = selection_file(tmp_path)
    assert selection_file(tmp_path) == path  # written once, named by its content
    docs, items = load_squad(path)
    titles = {d.title for d in docs}
    assert titles == {t.replace("_", " ") for t in D.READER_SELECT_ARTICLES}
    assert len(docs) > len(D._select_paragraphs())  # the whole articles: paragraphs without a question too
    assert {i.id for i in items} == {q.id for q in D.reader_select(None)}
    assert all(len(i.gold_doc_ids) == 1 and i.gold_doc_ids <= {d.doc_id for d in docs} for i in items)
