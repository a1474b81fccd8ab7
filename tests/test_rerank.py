import pytest

from edge_rag.config import Config
from edge_rag.retrieval.rerank import rerank, rerank_scores
from edge_rag.types import Passage

QUESTION = "When was the Eiffel Tower built?"


def _p(id: int, title: str, text: str, score: float) -> Passage:
    return Passage(id=id, doc_id=f"d{id}", title=title, text=text, score=score)


PASSAGES = [
    _p(0, "Paris", "The city has many monuments and museums.", 0.70),
    _p(1, "Eiffel Tower", "The tower was built between 1887 and 1889.", 0.70),
    _p(2, "Gustave Eiffel", "Eiffel built the Eiffel Tower for the 1889 fair.", 0.70),
    _p(3, "London", "Big Ben is a clock tower.", 0.65),
]


def test_lexical_and_title_match_wins_cosine_ties():
    # question keywords {eiffel, tower, built}; h = 0.6 cosine + 0.3 text overlap + 0.1 title overlap
    h = rerank_scores(QUESTION, PASSAGES, Config())
    assert h == pytest.approx([0.42, 0.42 + 0.3 * 2 / 3 + 0.1 * 2 / 3, 0.42 + 0.3 + 0.1 / 3, 0.39 + 0.3 / 3])
    assert [p.id for p in rerank(QUESTION, PASSAGES, Config())] == [2, 1, 3, 0]


def test_title_breaks_a_lexical_tie():
    a = _p(0, "Paris", "Eiffel tower built", 0.5)
    b = _p(1, "Eiffel Tower", "Eiffel tower built", 0.5)
    assert [p.id for p in rerank(QUESTION, [a, b], Config())] == [1, 0]


def test_dense_only_weights_reproduce_cosine_order_and_keep_scores():
    config = Config().with_(rerank_lexical_weight=0.0, rerank_title_weight=0.0)
    shuffled = [PASSAGES[3], PASSAGES[1], PASSAGES[0], PASSAGES[2]]
    out = rerank(QUESTION, shuffled, config)
    assert [p.id for p in out] == [1, 0, 2, 3]  # descending cosine; the three ties keep input order
    assert out[0] is PASSAGES[1] and [p.score for p in out] == [0.70, 0.70, 0.70, 0.65]


def test_empty_and_keywordless_question():
    assert rerank(QUESTION, [], Config()) == []
    # no keywords: only cosine counts
    assert [p.id for p in rerank("What is it?", PASSAGES[::-1], Config())] == [2, 1, 0, 3]
