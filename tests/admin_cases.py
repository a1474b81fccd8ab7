"""A server for the operator page's tests: the sample store, a question log holding labelled questions."""
from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

import serving

from edge_rag.cli.commands import SAMPLE_DIR
from edge_rag.config import Config
from edge_rag.pipeline import EdgeRAG
from edge_rag.serve.config import ServeConfig
from edge_rag.serve.question_log import QuestionLog

OFF_TOPIC = ["How do I bake sourdough bread?", "Who won the 1998 World Cup?", "What is the capital of Peru?",
             "How tall is Mount Everest?", "Can you recommend a good laptop?", "What is the speed of light?"]
NOT_SAID = ["Does the museum have a dress code?", "Can I bring my dog to the museum?",
            "Who cleans the museum at night?", "How many visitors came last year?"]
LEAST = 30  # labelled askings the test servers' calibration needs


def sample_labels() -> list[dict]:
    """The sample corpus's own questions with their answers, then questions the documents do not answer."""
    sample = json.loads((SAMPLE_DIR / "questions.json").read_text(encoding="utf-8"))
    return ([{"question": q["question"], "answer": q["answer"], "label": "answer" if q["answer"] else "off-topic"}
             for q in sample]
            + [{"question": q, "answer": None, "label": "off-topic"} for q in OFF_TOPIC]
            + [{"question": q, "answer": None, "label": "not-in-documents"} for q in NOT_SAID])


def logged_server(sample_db: Path, folder: Path, times: int = 1):
    """A server over a copy of the sample store whose question log already holds every labelled question, each
    asked ``times`` times (the first once more, typed differently), each asking another visitor's: 10 minutes after
    the one before, as the log writes them (asked again at once, a question counts once: labels.REPEAT_S)."""
    db = folder / "db"
    shutil.copytree(sample_db, db)
    log = QuestionLog(folder / "questions.jsonl")
    asked = [e["question"] for _ in range(times) for e in sample_labels()] + ["  " + sample_labels()[0]["question"].upper()]
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=10 * len(asked))
    assert log.path is not None
    with open(log.path, "a", encoding="utf-8") as f:
        for n, question in enumerate(asked):
            when = (start + datetime.timedelta(minutes=10 * n)).isoformat(timespec="seconds")
            f.write(json.dumps({"question": question, "asked": when}, ensure_ascii=False) + "\n")
    rag = EdgeRAG(db, config=Config(temperature=0.0, index_threads=1))  # a server with writes
    return rag, serving.running_server(rag, ServeConfig(port=0, token=serving.TOKEN, question_timeout_s=900,
                                                        question_log=str(log.path), min_labels=LEAST))
