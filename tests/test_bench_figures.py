"""The benchmark's figures computed as labelled: hand-made question rows through the harness's own summaries.

The rows are what ``benchmarks.run.ask_all`` writes to questions.jsonl.
"""
from __future__ import annotations

from benchmarks import decision
from evaluation.metrics import best_f1


def _row(answerable: bool, candidate: str, score: float, answer: str | None, gold: list[str]) -> dict:
    """A questions.jsonl row: ``answer`` None when refused; ``f1`` is that of the answer given, as ask_all sets it."""
    return {"answerable": answerable, "candidate": candidate, "score": score, "answer": answer, "gold": gold,
            "f1": best_f1(answer, gold) if answerable else None}


def test_risk_coverage_judges_each_candidate_by_its_own_answer():
    """A refused candidate that was right is a right answer on the curve (the curve answers it at a lower
    threshold): it once took the row's F1, 0 for every refusal, so a refused correct candidate counted as an error."""
    rows = [_row(True, "James Watt", 0.9, None, ["James Watt"]),  # right, refused by the system
            _row(True, "1712", 0.8, "1712", ["1712", "around 1712"]),  # right, answered
            _row(True, "steam", 0.7, None, ["internal combustion"]),  # wrong, refused
            _row(False, "Rankine", 0.6, None, [])]  # unanswerable: any answer is wrong
    assert decision.risk_coverage(rows) == [(0.25, 0.0), (0.5, 0.0), (0.75, 1 / 3), (1.0, 0.5)]
    answered = decision.error_among_answered(rows)  # the operating point: what the system said
    assert (answered["n_answered"], answered["n_errors"], answered["coverage"]) == (1, 0, 0.25)
