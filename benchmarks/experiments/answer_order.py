"""Same answer whatever was asked before (issue #42): fixed_k's answers to a run's questions, asked in order by one
pipeline and in reverse order by another (each its own llama.cpp context, so each keeps the prompt template's prefix
from its own history), compared answer for answer, with the tokens generated.

    python -m benchmarks.experiments.answer_order WORK [--questions ROWS] [--n 40]

WORK is the ``peer`` folder a ``python -m benchmarks`` run leaves (job.json names its store, bundle and resources);
ROWS its questions.jsonl (default: the job's questions). Prints how many answers differ and which.
"""
from __future__ import annotations

from benchmarks.experiments.generation_latency import job_questions, parser
from benchmarks.systems import preset, settings_config
from edge_rag import EdgeRAG


def main() -> None:
    job, questions = job_questions(parser(__doc__).parse_args())
    config = preset(settings_config(job["config"]), "fixed_k")
    answers = []
    for order in (questions, questions[::-1]):
        with EdgeRAG(job["db"], bundle=job["bundle"], config=config) as rag:
            answers.append({q: (a.answer, a.completion_tokens) for q in order for a in [rag.ask(q)]})
    differ = [q for q in questions if answers[0][q] != answers[1][q]]
    print(f"{len(differ)} of {len(questions)} answers differ between the two orders")
    for q in differ:
        print(f"  {q!r}: {answers[0][q]!r} / {answers[1][q]!r}")


if __name__ == "__main__":
    main()
