"""The shipped int8 reader back in torch (convert.reader.state_from_int8): a second training stage can start from
the device's reader. Compared with the device's own reads, not exact floats (int8 activations are rounded on the
device, not in torch)."""
from __future__ import annotations

import pytest
from test_reader import SAMPLE_DOCS, doc_passage

from convert import reader_model as M
from edge_rag.models import bundle as B
from edge_rag.models.registry import ROUTER_ASSET
from edge_rag.reading.reader import READER_ASSET, Reader
from edge_rag.types import Passage

QUESTIONS = ("Who founded the Harbourlight Science Museum?", "How much does an adult ticket cost?",
             "Where can visitors park?", "When does the museum open?")


def passages() -> list[Passage]:
    """Sample documents 01 … 12 (hours, tickets, parking, founder among them), one passage each."""
    return [doc_passage(pid, path.name) for pid, path in enumerate(sorted(SAMPLE_DOCS.glob("*.md"))[:12])]


def test_the_dequantized_reader_reads_as_the_device_reader(bundle: B.Bundle):
    model = M.load_model(READER_ASSET)
    tok = M.windowing()
    device = Reader(READER_ASSET, bundle.require(B.ROLE_TOKENIZER), threads=2)
    pairs = [(q, p) for q in QUESTIONS for p in passages()]
    same_text = same_decision = 0
    for q, p in pairs:
        torch_read = M.read_one(model, tok, q, p.title, p.text)
        span = device.read(q, [p])
        same_decision += (torch_read["margin"] > 0) == (span.margin > 0)
        same_text += (torch_read["text"] or "") == (span.text or "") or (torch_read["margin"] <= 0 and span.margin <= 0)
    assert same_decision >= 0.9 * len(pairs) and same_text >= 0.8 * len(pairs), (same_decision, same_text, len(pairs))
    passage = next(p for p in passages() if "founder" in p.doc_id)
    founder, on_device = M.read_one(model, tok, QUESTIONS[0], passage.title, passage.text), device.read(QUESTIONS[0], [passage])
    assert "Hollins" in founder["text"] and (founder["margin"] > 0) == (on_device.margin > 0)


def test_a_model_of_another_shape_is_refused():
    with pytest.raises(ValueError, match="not a reader"):
        M.load_model(ROUTER_ASSET)


def test_the_hard_negative_hinge_counts_only_while_the_plausible_span_is_within_the_margin_of_null():
    import torch

    from convert import reader_data as D
    from convert.train_reader import HARD_MARGIN, span_loss

    ce = torch.nn.CrossEntropyLoss()
    marked = [D.Example([0] * 8, [0] * 8, 0, 0, "impossible", 3, 4), D.Example([0] * 8, [0] * 8, 2, 2, "answerable")]
    plain = [D.Example([0] * 8, [0] * 8, 0, 0, "impossible"), marked[1]]
    start, end = torch.zeros(2, 8), torch.zeros(2, 8)
    start[0, 3] = end[0, 4] = 2.0  # the plausible span outscores [CLS] by 4
    assert span_loss(start, end, marked, ce) > span_loss(start, end, plain, ce)
    start[0, 0] = end[0, 0] = 2.0 + HARD_MARGIN  # [CLS] ahead by 2 x the margin: nothing left to push
    assert torch.isclose(span_loss(start, end, marked, ce), span_loss(start, end, plain, ce))


@pytest.mark.parametrize("argv, why", [
    (["--skip-train"], "holds no scored checkpoint"),  # a FileNotFoundError traceback of history.json before
    (["--examples", "-5"], "below 0"),  # a ValueError of random.sample after minutes of building examples
    (["--checkpoints", "0"], "below 1"),  # trained, then no checkpoint to export
    (["--mix", "answerabel=1"], "no source 'answerabel'"),  # named only after minutes of building examples
    (["--mix", "answerable=1", "--examples", "0"], "--mix needs --examples"),  # 0 windows of each share
    (["--init", "no-such-reader.pt"], "no such file"),
])
def test_train_reader_refuses_nonsense_arguments_before_any_work(tmp_path, capsys, argv, why):
    from convert.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["train-reader", "--work", str(tmp_path), *argv])
    assert why in f"{exc.value.code} {capsys.readouterr().err}" and exc.value.code != 0
    assert not any(tmp_path.iterdir())  # nothing started


@pytest.fixture
def tiny_reader(tmp_path, monkeypatch) -> None:
    """make reader's code on a tiny run: a 1-layer BERT with MiniLM's tokenizer as the base, 11 short paragraphs
    to train on (4 windows a step), 2 to score on and an answerable and an unanswerable one to choose by."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    from convert import reader_data as D
    from convert import train_reader as T

    base = tmp_path / "base"
    torch.manual_seed(0)
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
              ).save_pretrained(base)
    shutil.copyfile(M.model_dir() / "tokenizer.json", base / "tokenizer.json")
    monkeypatch.setattr(M, "model_dir", lambda: base)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()
    questions = [D.Question(f"q{i}", f"Who is {w}?", "a", "A", f"{w} is the {i}th one. {w} came in {1900 + i}.",
                            (w,), 0, "squad") for i, w in enumerate(words)]
    monkeypatch.setattr(D, "reader_train", lambda: questions)
    monkeypatch.setattr(D, "reader_val", lambda: questions[:2])
    unanswerable = D.Question("u", "Who is omega?", "a", "A", questions[3].context, (), -1, "squad")
    monkeypatch.setattr(D, "reader_select", lambda sample=None, seed=0: [questions[2], unanswerable])
    monkeypatch.setattr(T, "BATCH", 4)


def stopped_at_the_third_step(monkeypatch, argv: list[str]) -> None:
    """``main(argv)`` stopped by a Ctrl-C at the third training step (after the checkpoint at step 2 of 3 with
    --checkpoints 2); span_loss is then the real one again."""
    from convert import train_reader as T
    from convert.__main__ import main

    real, calls = T.span_loss, []

    def stop(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args)
    with monkeypatch.context() as m:
        m.setattr(T, "span_loss", stop)
        with pytest.raises(KeyboardInterrupt):
            main(argv)


def test_a_resumed_training_run_trains_the_reader_a_run_never_stopped_trains(tiny_reader, tmp_path, monkeypatch):
    """make reader is resumable and seeded: a run stopped after its last saved state and run again ends with the
    same weights, bit for bit, as one never stopped (3 steps)."""
    import torch

    from convert import train_reader as T
    from convert.__main__ import main

    monkeypatch.setattr(T, "SAVE_EVERY_S", -1)  # the state after every step
    argv = ["train-reader", "--examples", "12", "--checkpoints", "1", "--no-export", "--swaps", "0"]
    main([*argv, "--work", str(tmp_path / "whole")])
    stopped_at_the_third_step(monkeypatch, [*argv, "--work", str(tmp_path / "stopped")])  # Ctrl-C after two steps
    main([*argv, "--work", str(tmp_path / "stopped")])
    (whole,), (resumed,) = (list((tmp_path / run).glob("run-*/step3.pt")) for run in ("whole", "stopped"))
    a, b = torch.load(whole), torch.load(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a), max(float((a[k] - b[k]).abs().max()) for k in a)


def test_a_reader_export_that_fails_its_parity_check_is_not_shipped(tiny_reader, tmp_path, monkeypatch):
    """The export is checked against torch before it replaces the shipped reader: a wrong export (its span head
    flipped after torch was read) fails the gates, exits non-zero and leaves the shipped reader.onnx as it was."""
    import copy

    import torch

    from convert import reader as X
    from convert import reader_report as R
    from convert.__main__ import main

    shipped = tmp_path / "assets" / "reader.onnx"
    shipped.parent.mkdir()
    shipped.write_bytes(b"the shipped reader")
    monkeypatch.setattr(R, "READER_ASSET", shipped)
    monkeypatch.setattr(R, "ASSETS", shipped.parent)
    monkeypatch.setattr(R, "QEMU_SAMPLE", 0)
    export = X.export_fp32

    def wrong_export(model, out):
        wrong = copy.deepcopy(model)
        with torch.no_grad():
            wrong.head.weight.mul_(-3.0)
        return export(wrong, out)
    monkeypatch.setattr(X, "export_fp32", wrong_export)
    argv = ["train-reader", "--examples", "8", "--checkpoints", "1", "--swaps", "0", "--work", str(tmp_path / "w")]
    main([*argv, "--no-export"])
    with pytest.raises(SystemExit, match="failed its parity check"):
        main([*argv, "--skip-train"])
    assert shipped.read_bytes() == b"the shipped reader" and not (shipped.parent / "reader.onnx.parity.json").exists()
    (report,) = (tmp_path / "w").glob("run-*/reader.int8.onnx.parity.json")
    assert '"passed": false' in report.read_text()


def test_skip_train_refuses_a_run_stopped_before_its_last_checkpoint(tiny_reader, tmp_path, monkeypatch):
    """--skip-train exports from the run's scored checkpoints: a run stopped after the first of its two checkpoints
    shipped a reader chosen among that one, as if training had finished. It is refused now, saying to resume, and the
    shipped reader stays; the run resumed to its end then exports."""
    from convert import train_reader as T
    from convert.__main__ import main

    shipped = tmp_path / "reader.onnx"
    shipped.write_bytes(b"the shipped reader")
    monkeypatch.setattr(T, "finish", lambda args: shipped.write_bytes(b"exported"))  # the export, once chosen
    argv = ["train-reader", "--examples", "12", "--checkpoints", "2", "--swaps", "0", "--work", str(tmp_path / "w")]
    stopped_at_the_third_step(monkeypatch, argv)
    with pytest.raises(SystemExit, match="stopped at step 2 of 3"):
        main([*argv, "--skip-train"])
    assert shipped.read_bytes() == b"the shipped reader"
    main(argv)
    assert shipped.read_bytes() == b"exported"


def test_a_history_write_cut_short_keeps_the_previous_history(tiny_reader, tmp_path, monkeypatch):
    """history.json is rewritten at every checkpoint: a write cut short (ENOSPC part-way, as a kill would) left half
    a JSON, and --skip-train on that run failed with a JSONDecodeError traceback. The previous history stays whole
    now, and the run says where it stopped."""
    import errno
    from pathlib import Path

    from convert.__main__ import main

    real, writes = Path.write_text, []

    def cut_short(self, text, *args, **kwargs):
        if "history.json" in self.name and writes.append(1) is None and len(writes) == 2:  # the checkpoint at step 3
            real(self, text[:len(text) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, text, *args, **kwargs)
    monkeypatch.setattr(Path, "write_text", cut_short)
    argv = ["train-reader", "--examples", "12", "--checkpoints", "2", "--swaps", "0", "--work", str(tmp_path / "w")]
    with pytest.raises(OSError, match="No space left"):
        main([*argv, "--no-export"])
    with pytest.raises(SystemExit, match="stopped at step 2 of 3"):
        main([*argv, "--skip-train"])


def test_a_resume_with_other_constants_or_data_is_refused(tiny_reader, tmp_path, monkeypatch, capsys):
    """The run folder is named by the command's settings only: a resume after a change of BATCH or of the training
    data went on silently from the other run's state (at its step, in another batch order). The run records a
    fingerprint of what it trains on, and a resume that differs is refused, naming what changed; a run from before
    fingerprints resumes unchecked, and says so."""
    import torch

    from convert import reader_data as D
    from convert import train_reader as T
    from convert.__main__ import main

    argv = ["train-reader", "--examples", "12", "--checkpoints", "2", "--swaps", "0", "--no-export",
            "--work", str(tmp_path / "w")]
    stopped_at_the_third_step(monkeypatch, argv)
    with monkeypatch.context() as m:
        m.setattr(T, "BATCH", 2)
        with pytest.raises(SystemExit, match="BATCH 4 → 2"):
            main(argv)
    with monkeypatch.context() as m:
        questions = D.reader_train()
        m.setattr(D, "reader_train", lambda: [*questions[1:], questions[0]])  # the same windows, another order
        with pytest.raises(SystemExit, match="windows"):
            main(argv)
    (state_file,) = (tmp_path / "w").glob("run-*/state.pt")
    state = torch.load(state_file, weights_only=False)
    del state["history"]["fingerprint"]  # a run folder made before fingerprints
    torch.save(state, state_file)
    main(argv)
    assert "before run fingerprints" in capsys.readouterr().out
    assert "fingerprint" in torch.load(state_file, weights_only=False)["history"]
