"""How ``edge-rag ask`` takes its questions and prints their answers."""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator

from ..types import Answer


def print_answer(answer: Answer, as_json: bool) -> None:
    if as_json:
        print(json.dumps(answer.to_dict()))  # JSON Lines: one object a line, several questions parse one by one
        return
    print(f"Q: {answer.question}")
    print(f"A: {answer.answer if answer.answer is not None else '(no answer: ' + str(answer.refusal_reason) + ')'}")
    timings = ", ".join(f"{k} {v:.1f}" for k, v in answer.timings_ms.items())
    print(f"   route {answer.route.value} | tier {answer.tier.value} | d_min {answer.d_min:.3f} | "
          f"{answer.total_ms:.0f} ms ({timings}) | peak RSS {answer.peak_rss_mb:.0f} MB")


def print_unasked(n: int, question: str, error: Exception, as_json: bool) -> None:
    """A question that cannot be asked: one error line on stderr naming it by its place, and with --json a line
    {"question", "error"} in its answer's place, so the Nth line stays the Nth question's."""
    print(f"edge-rag: error: question {n}: {error}", file=sys.stderr)
    if as_json:  # its undecodable bytes (lone surrogates) as "?": a strict JSON parser refuses a lone \ud800
        print(json.dumps({"question": question.encode("utf-8", "replace").decode(), "error": str(error)}))


def questions(given: list[str]) -> Iterator[str]:
    """The questions in the order given, ``-`` standing for standard input's lines (blank ones skipped), each
    yielded as it arrives: a pipe or a person typing is answered line by line."""
    for question in given:
        if question == "-":
            yield from (line.strip() for line in sys.stdin if line.strip())
        else:
            yield question
