"""End to end through the public API and the CLI, in fresh processes."""
import json
import subprocess
import sys

import pytest
from conftest import ROOT, SAMPLE_DOCS

from edge_rag.errors import InputError
from edge_rag.types import Route

NO_TORCH = """
import sys, edge_rag
rag = edge_rag.EdgeRAG(sys.argv[1], bundle=sys.argv[2])
rag.add_files([sys.argv[3]])
answer = rag.ask("Who founded the Harbourlight Science Museum?")
print(answer.answer)
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
"""


def test_runtime_never_imports_torch(tmp_path, bundle_dir):
    out = subprocess.run([sys.executable, "-c", NO_TORCH, str(tmp_path / "db"), str(bundle_dir), str(SAMPLE_DOCS)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_cli_index_and_ask_json(tmp_path, bundle_dir):
    db = tmp_path / "db"
    cli = [sys.executable, "-m", "edge_rag"]
    index = subprocess.run(cli + ["index", str(SAMPLE_DOCS), "--db", str(db), "--bundle", str(bundle_dir), "--quiet"],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert index.returncode == 0, index.stderr
    assert "added" in index.stdout
    ask = subprocess.run(cli + ["ask", "How much does an adult ticket cost?", "--db", str(db), "--bundle",
                                str(bundle_dir), "--json", "--temperature", "0"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert ask.returncode == 0, ask.stderr
    answer = json.loads(ask.stdout)
    assert answer["route"] in {r.value for r in Route}
    assert set(answer["timings_ms"]) >= {"encode", "retrieve"}
    assert answer["peak_rss_mb"] > 0 and answer["passages"]


def test_cli_reports_errors_without_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "edge_rag", "ask", "hi", "--db", str(tmp_path),
                          "--bundle", str(tmp_path / "nothing")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "edge-rag: error: no model bundle" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("question", ["", "   ", "x" * 5000])
def test_bad_questions(sample_rag, question):
    with pytest.raises(InputError):
        sample_rag.ask(question)


def test_answer_records_every_field(sample_rag):
    answer = sample_rag.ask("Who founded the Harbourlight Science Museum?")
    assert answer.passages and answer.d_min < 1.0 and answer.context_chars > 0
    assert answer.peak_rss_mb > 0 and all(v >= 0 for v in answer.timings_ms.values())
    if answer.route is Route.GPT:
        assert answer.prompt_tokens > 0 and answer.completion_tokens > 0
    assert "Hollins" in (answer.answer or "")


def test_sample_questions_are_answered_and_off_topic_ones_refused(sample_rag):
    """What `make demo` shows: the packaged questions answered right (token F1 >= 0.5 against the
    sample's gold answer; 17 of the 20 at the time of writing) and the off-topic ones refused."""
    from edge_rag.cli import SAMPLE_DIR
    from edge_rag.config import Config
    from edge_rag.metrics import best_f1
    from edge_rag.pipeline import EdgeRAG

    items = json.loads((SAMPLE_DIR / "questions.json").read_text(encoding="utf-8"))
    # The seed decision path: the certified default (reader at alpha 0.7) answers only 9 of the 20, 4 right
    # (tests/test_certified.py covers it); this bar is the rule extractor's.
    with EdgeRAG(sample_rag.store.folder, bundle=sample_rag.bundle.root,
                 config=Config(temperature=0.0, certified=False, reader="rules")) as seed:
        answers = {q["question"]: seed.ask(q["question"]) for q in items}
    answerable = [q for q in items if q["answer"]]
    right = [q["question"] for q in answerable if best_f1(answers[q["question"]].answer, [q["answer"]]) >= 0.5]
    assert len(right) >= 0.8 * len(answerable), sorted(set(answers) - set(right))
    assert all(answers[q["question"]].route is Route.REFUSE for q in items if not q["answer"])
