"""One check of the lexical candidate budget (lexical.POSTINGS_BUDGET, Config.lexical_budget) that both stores' tests
run."""
from __future__ import annotations

import numpy as np

from edge_rag import Config
from edge_rag.documents.chunk import make_document
from edge_rag.retrieval import retrieve
from edge_rag.storage.store_db import Part

TERMS = ["museum", "zeppelin"]


def check_rarest_terms_pick_the_candidates(store, dim: int) -> None:
    """40 passages hold "museum", 7 "zeppelin" (3 of them both). At a budget of 10 postings only the 7 are
    candidates, with the scores every term gives them (the same as an unbounded search's), those holding both
    first; an unbounded search also ranks the museum-only passages. Every top k of the candidates is exact: the
    best k of their unbounded scores. The pipeline's search takes its budget from the Config."""
    texts = ([f"The museum room {i} shows old maps" for i in range(40)]
             + [f"The zeppelin hangar {i} held airships" for i in range(4)]
             + [f"The museum keeps zeppelin engine {i}" for i in range(3)])
    docs = [make_document(t, f"doc{i}") for i, t in enumerate(texts)]
    vectors = np.random.default_rng(0).normal(size=(len(texts), dim)).astype(np.float32)
    store.add([Part(d, 0, [t], last=True, sha=d.doc_id) for d, t in zip(docs, texts)],
              vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    exact = dict(store.search_text(TERMS, 50, budget=10**9))
    budgeted = store.search_text(TERMS, 10, budget=10)
    text = {p.id: p.text for p in store.passages(list(exact))}
    assert len(exact) == len(texts) and {text[i] for i, _ in budgeted} == set(texts[40:])
    assert all(abs(score - exact[i]) < 1e-9 for i, score in budgeted)
    assert {text[i] for i, _ in budgeted[:3]} == set(texts[44:])
    best = sorted((exact[i] for i, _ in budgeted), reverse=True)
    for k in range(1, len(best) + 1):
        assert np.allclose([s for _, s in store.search_text(TERMS, k, budget=10)], best[:k], rtol=0, atol=1e-9)
    question, lexical = "museum zeppelin?", Config(retrieval="lexical")
    for budget, holding in ((10, texts[40:]), (10**9, texts)):
        found = retrieve.search(store, vectors[0], question, 10, lexical.with_(lexical_budget=budget)).passages
        assert len(found) == min(10, len(holding)) and {p.text for p in found} <= set(holding)


NUMBER_TEXTS = ["On 26 May 26 men and 1,000 horses crossed",
                "The army had 26,000 troops and more in reserve for the war",
                "About 3.7 billion years ago the oldest rocks formed",
                "Its 3 towers and 7 gates stood for centuries"]


def check_numbers_match_as_written(store, dim: int) -> np.ndarray:
    """A number written with a separator ("3.7", "26,000") is asked for as the engine indexed it, beside its digits:
    PostgreSQL indexes "3.7" whole, so "3" OR "7" never found it. Returns the vectors of NUMBER_TEXTS, added here."""
    docs = [make_document(t, f"doc{i}") for i, t in enumerate(NUMBER_TEXTS)]
    vectors = np.eye(dim, dtype=np.float32)[: len(NUMBER_TEXTS)]
    store.add([Part(d, 0, [t], last=True, sha=d.doc_id) for d, t in zip(docs, NUMBER_TEXTS)], vectors)
    found = retrieve.search(store, vectors[0], "What was 3.7?", 4, Config(retrieval="lexical")).passages
    assert NUMBER_TEXTS[2] in [p.text for p in found if p.lexical > 0], [p.text for p in found]
    return vectors


GREETING = [f"aword{i:02d}" for i in range(40)]  # a long question's common words, all sorting before "zeppelin"


def check_a_long_question_keeps_its_rarest_words(store, dim: int) -> tuple[np.ndarray, str]:
    """A question of more than MAX_TERMS words is searched by its rarest, not by its alphabetically first: the
    one word that names the subject sorted after 40 common ones and was never asked for. Returns the vectors of
    the passages added here and the subject's passage."""
    texts = [" ".join(GREETING) + f" room {i}" for i in range(10)] + ["The zeppelin hangar held airships",
                                                                     "The garden has old trees"]
    docs = [make_document(t, f"doc{i}") for i, t in enumerate(texts)]
    vectors = np.eye(dim, dtype=np.float32)[np.arange(len(texts)) % dim]
    store.add([Part(d, 0, [t], last=True, sha=d.doc_id) for d, t in zip(docs, texts)], vectors)
    found = retrieve.search(store, vectors[11], " ".join(GREETING) + ", where was the zeppelin?", 12,
                            Config(retrieval="lexical")).passages
    assert texts[10] in [p.text for p in found if p.lexical > 0], [p.text[-8:] for p in found]
    return vectors, texts[10]


SCRIPT_TEXTS = ["संग्रहालय सुबह दस बजे खुलता है।", "Our travelling exhibition moves to İstanbul in the autumn.",
                "The gallery café serves crêpes until six.", "Lockers stand by the main stairs."]


def check_words_match_in_every_script(store, dim: int) -> None:
    """A question's word is asked for whole, as the engines index it: Python's \\w holds no combining mark, so Hindi
    "संग्रहालय" was asked for as "रह" OR "लय" (PostgreSQL indexes the word whole: found nothing), and "İstanbul" as
    "i" and a combining dot before "stanbul" (PostgreSQL indexes "istanbul"). A pasted zero-width space is no cut."""
    docs = [make_document(t, f"doc{i}") for i, t in enumerate(SCRIPT_TEXTS)]
    vectors = np.eye(dim, dtype=np.float32)[: len(SCRIPT_TEXTS)]
    store.add([Part(d, 0, [t], last=True, sha=d.doc_id) for d, t in zip(docs, SCRIPT_TEXTS)], vectors)
    lexical = Config(retrieval="lexical")
    for question, holding in (("संग्रहालय कब खुलता है?", 0), ("İSTANBUL?", 1), ("İstanbul?", 1), ("ca\u200bfé?", 2)):
        found = retrieve.search(store, vectors[3], question, 4, lexical).passages
        assert [p.text for p in found if p.lexical > 0] == [SCRIPT_TEXTS[holding]], (question, found)
