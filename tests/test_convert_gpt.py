"""GPT → GGUF round trip: a tiny GPT-2 trained on SQuAD, converted from both checkpoint kinds to f16 and
Q8_0, run in llama.cpp and compared with torch; plus the checkpoint errors a user can hit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gpt_fixture import TinyGPT, tiny_gpt  # pytest puts tests/ (no __init__.py) on sys.path
from safetensors.torch import load_file, save_file

from convert.__main__ import main
from convert.gpt import (
    GPT,
    MAX_PPL_REL_DIFF,
    MIN_TOP1_AGREEMENT,
    CheckpointError,
    GPTConfig,
    convert_gpt,
    load_checkpoint,
)

THREADS = 1  # the tiny model gains nothing from more, and one thread suffers least on a busy machine
GREEDY_PROMPTS, GREEDY_NEW = 5, 32
QUICK = {"verify_tokens": 1024, "n_threads": THREADS}  # for exports checked for structure, not the thresholds


@pytest.fixture(scope="module")
def tiny() -> Iterator[TinyGPT]:
    model = tiny_gpt()  # trains with its own thread count when the cache is cold
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield model
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def exports(tiny, tmp_path_factory) -> dict[tuple[str, str], tuple[Path, dict]]:
    """(source format, type) → (GGUF path, parity report), each converted once for the module."""
    out = tmp_path_factory.mktemp("gguf")
    text = tiny.heldout.read_text(encoding="utf-8")
    done = {}
    for fmt, src in (("nanogpt", tiny.nanogpt_ckpt), ("hf", tiny.hf_dir)):
        for kind in ("f16", "q8_0"):
            path = out / f"{fmt}-{kind}.gguf"
            done[fmt, kind] = path, convert_gpt(src, path, kind, verify_text=text, n_threads=THREADS)
    return done


@pytest.mark.parametrize("fmt", ["nanogpt", "hf"])
@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_parity_thresholds(exports, fmt, kind):
    path, report = exports[fmt, kind]
    assert report["passed"], report["failures"]
    assert report["source_format"] == fmt
    assert report["top1_agreement"] >= MIN_TOP1_AGREEMENT[kind]
    assert report["ppl_rel_diff"] <= MAX_PPL_REL_DIFF[kind]
    assert report["tokenizer_agreement"] == 1.0
    # greedy_match is reported, not gated: one near-tie flips a whole continuation on another CPU's kernels
    assert report["tokens_compared"] >= 4000
    assert json.loads(Path(str(path) + ".parity.json").read_text())["passed"] is True


def test_metadata_vocab_and_tensor_types(tiny, exports):
    cfg = tiny.model().config
    tok = json.loads(tiny.tokenizer.read_text(encoding="utf-8"))
    for kind, weight_type in (("f16", "F16"), ("q8_0", "Q8_0")):
        reader = gguf.GGUFReader(exports["nanogpt", kind][0])
        fields = {name: f.contents() for name, f in reader.fields.items()}
        assert fields["general.architecture"] == "gpt2"
        assert fields["gpt2.context_length"] == cfg.block_size
        assert fields["gpt2.embedding_length"] == cfg.n_embd
        assert fields["gpt2.feed_forward_length"] == 4 * cfg.n_embd
        assert fields["gpt2.block_count"] == cfg.n_layer
        assert fields["gpt2.attention.head_count"] == cfg.n_head
        assert fields["tokenizer.ggml.model"] == "gpt2"
        assert fields["tokenizer.ggml.pre"] == "gpt-2"
        tokens = fields["tokenizer.ggml.tokens"]
        assert len(tokens) == cfg.vocab_size > len(tok["model"]["vocab"])  # padded like nanoGPT's 50304
        assert all(tokens[i] == t for t, i in tok["model"]["vocab"].items())
        assert len(fields["tokenizer.ggml.merges"]) == len(tok["model"]["merges"])
        assert tokens[fields["tokenizer.ggml.eos_token_id"]] == "<|endoftext|>"
        assert fields["tokenizer.ggml.add_bos_token"] is False

        types = {t.name: t.tensor_type.name for t in reader.tensors}
        assert "output.weight" not in types  # tied: llama.cpp's gpt2 falls back to token_embd
        assert types["token_embd.weight"] == types["blk.0.attn_qkv.weight"] == weight_type
        assert types["position_embd.weight"] == "F32"
        assert all(v == "F32" for k, v in types.items() if k.endswith((".bias", "norm.weight")))
        assert (
            len(types) == 4 + 12 * cfg.n_layer
        )  # wte, wpe, ln_f weight and bias; 6 weights + 6 biases a block
    assert exports["nanogpt", "q8_0"][0].stat().st_size < 0.65 * exports["nanogpt", "f16"][0].stat().st_size


def test_both_checkpoint_kinds_give_the_same_tensors(exports):
    for kind in ("f16", "q8_0"):
        a, b = (gguf.GGUFReader(exports[fmt, kind][0]) for fmt in ("nanogpt", "hf"))
        assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
        for x, y in zip(a.tensors, b.tensors, strict=True):
            assert np.array_equal(x.data, y.data), x.name


@torch.no_grad()
def test_greedy_generation_through_llama_sampler(tiny, exports):
    """Text prompts through llama.cpp's own tokenizer and greedy sampler, as the device runtime does.

    Each token llama.cpp picks is checked teacher-forced: torch, given llama.cpp's own prefix, must rank
    it first (the parity threshold's share of positions). Comparing two free-running continuations
    instead would fail on any CPU whose kernels flip one near-tie early."""
    from llama_cpp import Llama

    model = tiny.model()
    lines = [ln for ln in tiny.heldout.read_text(encoding="utf-8").splitlines() if ln.strip()]
    prompts = [" ".join(ln.split()[:12]) for ln in lines[:: len(lines) // GREEDY_PROMPTS][:GREEDY_PROMPTS]]
    for kind in ("f16", "q8_0"):
        llm = Llama(str(exports["nanogpt", kind][0]), n_ctx=128, n_threads=THREADS, verbose=False)
        agree = total = 0
        for prompt in prompts:
            ids = llm.tokenize(prompt.encode(), add_bos=False)
            got = []
            for token in llm.generate(ids, top_k=1, temp=0.0, reset=True):
                got.append(token)
                if len(got) == GREEDY_NEW:
                    break
            logits, _ = model(torch.tensor([ids + got[:-1]]))
            torch_top = logits[0, len(ids) - 1 :].argmax(dim=-1).tolist()
            agree += sum(a == b for a, b in zip(got, torch_top, strict=True))
            total += len(got)
        llm.close()
        assert total == GREEDY_PROMPTS * GREEDY_NEW
        assert agree / total >= MIN_TOP1_AGREEMENT[kind], f"{kind}: teacher-forced agreement {agree / total:.3f}"


def test_untied_lm_head_is_written_as_output(tiny, tmp_path):
    ckpt = torch.load(tiny.nanogpt_ckpt, weights_only=True)
    sd = dict(ckpt["model"])
    sd["lm_head.weight"] = sd["transformer.wte.weight"] * 1.5  # a separate output matrix
    torch.save({**ckpt, "model": sd}, tmp_path / "untied.pt")
    out = tmp_path / "untied.gguf"
    text = tiny.heldout.read_text()
    report = convert_gpt(
        tmp_path / "untied.pt", out, "f16", tokenizer=tiny.tokenizer, verify_text=text, **QUICK
    )
    assert report["passed"], report["failures"]
    assert report["tied_embeddings"] is False
    assert "output.weight" in {t.name for t in gguf.GGUFReader(out).tensors}


def test_bias_free_checkpoint_gets_zero_biases(tiny, tmp_path):
    """nanoGPT's bias=False: llama.cpp's gpt2 graph requires biases, zeros are exact."""
    ckpt = torch.load(tiny.nanogpt_ckpt, weights_only=True)
    sd = {k: v for k, v in ckpt["model"].items() if not k.endswith(".bias")}
    torch.save({"model": sd, "model_args": {**ckpt["model_args"], "bias": False}}, tmp_path / "nobias.pt")
    report = convert_gpt(
        tmp_path / "nobias.pt",
        tmp_path / "nobias.gguf",
        "f16",
        tokenizer=tiny.tokenizer,
        verify_text=tiny.heldout.read_text(),
        **QUICK,
    )
    assert report["passed"], report["failures"]


def test_cli(tiny, tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    args = ["gpt", str(tiny.hf_dir), "--out", str(out), "--type", "q8_0", "--threads", str(THREADS)]
    assert main([*args, "--verify-text", str(tiny.heldout), "--verify-tokens", "512"]) == 0
    assert "[PASS] cli.gguf" in capsys.readouterr().out
    assert main(args) == 1  # written, but not verified: not marked good
    assert json.loads(Path(str(out) + ".parity.json").read_text())["passed"] is False


def test_cli_imports_only_the_named_command(monkeypatch):
    """`python -m convert gpt` imports convert.gpt alone: every other sub-command's libraries (transformers, onnx)
    cost seconds of CPU per call. Each name maps to the module that registers it (else that name would not parse)."""
    import importlib
    import re

    import convert.__main__ as cli

    loaded: list[str] = []
    real = importlib.import_module
    monkeypatch.setattr(cli.importlib, "import_module", lambda name, *a: loaded.append(name) or real(name, *a))
    with pytest.raises(SystemExit) as done:
        main(["gpt", "--help"])
    assert done.value.code == 0 and [m for m in loaded if m.startswith("convert.")] == ["convert.gpt"]
    folder = Path(cli.__file__).parent
    for name, module in cli.COMMANDS.items():
        assert re.search(rf'add_parser\(\s*"{name}"', (folder / f"{module}.py").read_text(encoding="utf-8")), name


def test_every_convert_option_says_what_it_is_in_its_help():
    """`python -m convert X --help` listed 19 options with no word on them (train-reader --seed, calibrate --bundle,
    encoder --threads, ...), where the edge-rag CLI's every option has one (make docs fails without)."""
    import argparse
    import importlib

    import convert.__main__ as cli

    sub = argparse.ArgumentParser().add_subparsers()
    for module in cli.COMMANDS.values():
        importlib.import_module(f"convert.{module}").register(sub)
    bare = [f"{name} {action.option_strings or action.dest}" for name, parser in sub.choices.items()
            for action in parser._actions if not action.help]
    assert not bare, bare


# -- errors a user can hit: each names the tensor or file at fault (random-init model, no data needed)


@pytest.fixture
def small(tmp_path) -> tuple[Path, dict]:
    cfg = GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=32)
    torch.manual_seed(0)
    ckpt = {
        "model": GPT(cfg).state_dict(),
        "model_args": {
            k: getattr(cfg, k) for k in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "bias")
        },
    }
    return tmp_path, ckpt


def test_missing_bias_names_the_tensor(small):
    tmp, ckpt = small
    del ckpt["model"]["transformer.h.1.attn.c_attn.bias"]
    torch.save(ckpt, tmp / "ckpt.pt")
    with pytest.raises(CheckpointError, match=r"missing tensor 'transformer\.h\.1\.attn\.c_attn\.bias'"):
        load_checkpoint(tmp / "ckpt.pt")


def test_wrong_shape_names_the_tensor(small):
    tmp, ckpt = small
    ckpt["model"]["transformer.h.0.mlp.c_fc.weight"] = torch.zeros(100, 32)
    torch.save(ckpt, tmp / "ckpt.pt")
    with pytest.raises(
        CheckpointError, match=r"'transformer\.h\.0\.mlp\.c_fc\.weight' has shape \(100, 32\)"
    ):
        load_checkpoint(tmp / "ckpt.pt")


def test_hf_errors_use_the_names_in_the_file(tiny, tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (hf / name).write_bytes((tiny.hf_dir / name).read_bytes())
    sd = load_file(tiny.hf_dir / "model.safetensors")
    sd["h.0.attn.c_proj.weight"] = sd["h.0.attn.c_proj.weight"][:, :64].contiguous()
    save_file(sd, hf / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"'h\.0\.attn\.c_proj\.weight' has shape"):
        load_checkpoint(hf)
    sd = load_file(tiny.hf_dir / "model.safetensors")
    del sd["h.1.ln_2.bias"]
    save_file(sd, hf / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing tensor 'transformer\.h\.1\.ln_2\.bias'"):
        load_checkpoint(hf)


def test_cli_reports_errors_and_missing_files(small, capsys):
    tmp, ckpt = small
    ckpt["model"]["transformer.wpe.weight"] = torch.zeros(16, 32)
    torch.save(ckpt, tmp / "ckpt.pt")
    assert main(["gpt", str(tmp / "ckpt.pt"), "--out", str(tmp / "x.gguf")]) == 2
    assert "transformer.wpe.weight" in capsys.readouterr().err
    state = tmp / "state.pt"
    torch.save(
        GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=32)).state_dict(), state
    )
    with pytest.raises(CheckpointError, match="no config at"):
        load_checkpoint(state)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp / "absent.pt")


@pytest.mark.parametrize("argv", [
    ["encoder", "{missing}", "--out", "{out}"],  # FileNotFoundError of config.json
    ["encoder", "{cut_hf}", "--out", "{out}"],  # SafetensorError "incomplete metadata", naming no file
    ["kernels", "{missing}", "--out", "{out}"],
    ["gpt", "{cut_hf}", "--out", "{out}/m.gguf"],
    ["gpt", "{ckpt}", "--out", "{out}/m.gguf", "--verify-text", "{missing}"],
    ["router", "--checkpoint", "{missing}", "--out", "{out}/r.onnx"],  # IsADirectoryError / FileNotFoundError
    ["router", "--checkpoint", "{cut_pt}", "--out", "{out}/r.onnx"],  # RuntimeError of PytorchStreamReader
    ["score-reader", "--onnx", "{missing}"],
    ["score-reader", "--onnx", "{cut_onnx}"],  # BundleError INVALID_PROTOBUF
], ids=lambda argv: " ".join(a.strip("{}") for a in argv[:3]))
def test_a_missing_or_cut_short_input_is_one_line_and_status_2(tiny, tmp_path, capsys, argv):
    """A model file that is missing or cut short was a traceback of the library that read it (exit 1); it is now one
    line naming the file, status 2 as for any bad argument, and nothing is written."""
    import shutil

    from edge_rag.models.registry import ROUTER_ASSET

    cut_hf = shutil.copytree(tiny.hf_dir, tmp_path / "cut_hf")
    weights = cut_hf / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (tmp_path / "cut.pt").write_bytes(tiny.nanogpt_ckpt.read_bytes()[:3000])
    (tmp_path / "cut.onnx").write_bytes(ROUTER_ASSET.read_bytes()[:3000])
    paths = {"missing": str(tmp_path / "no-such"), "cut_hf": str(cut_hf), "ckpt": str(tiny.nanogpt_ckpt),
             "cut_pt": str(tmp_path / "cut.pt"), "cut_onnx": str(tmp_path / "cut.onnx"), "out": str(tmp_path / "out")}
    args = [a.format(**paths) for a in argv]
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's usage error
        code = exc.code
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (the exception itself escaped main before)
    assert code == 2 and "error: " in last, last
    assert any(Path(a).name in last for a in args if a.startswith(str(tmp_path)) and a != paths["out"]), last
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


@pytest.mark.parametrize("argv", [
    ["gpt", "{ckpt}", "--out", "{folder}"],
    ["router", "--random-init", "--out", "{folder}"],
    ["encoder", "{hf}", "--out", "{file}"],
], ids=lambda argv: argv[0])
def test_an_out_of_the_wrong_kind_is_refused_before_the_export(tiny, tmp_path, capsys, argv):
    """`--out` a folder where a file is written (gpt, router), or a file where a folder is (encoder), was an
    IsADirectoryError / FileExistsError traceback, exit 1, after the whole export; now one line, status 2, first."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("mine")
    paths = {"ckpt": str(tiny.nanogpt_ckpt), "hf": str(tiny.hf_dir), "folder": str(tmp_path / "folder"),
             "file": str(tmp_path / "file")}
    assert main([a.format(**paths) for a in argv]) == 2
    assert f"--out {tmp_path}" in capsys.readouterr().err
    assert not any((tmp_path / "folder").iterdir()) and (tmp_path / "file").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"]  # no temporary left beside them


def test_a_bundle_refuses_an_export_that_failed_its_check(tiny, bundle, tmp_path):
    """`convert gpt` marks an export good only when llama.cpp agrees with torch (here: not verified at all, so not
    good); `convert bundle` of one's own exports packed it anyway, exit 0 (the encoder's 'do not ship these files'
    likewise). It now refuses it, naming the file and why, and writes no bundle."""
    from convert.__main__ import main
    from edge_rag.models import bundle as B

    gguf = tmp_path / "model.gguf"
    assert not convert_gpt(tiny.nanogpt_ckpt, gguf, "f16")["passed"]
    with pytest.raises(SystemExit, match=r"model\.gguf \(role generator\) failed its check.*not verified"):
        main(["bundle", "--out", str(tmp_path / "bundle"), "--encoder", str(bundle.require(B.ROLE_ENCODER)),
              "--tokenizer", str(bundle.require(B.ROLE_TOKENIZER)), "--gguf", str(gguf)])
    assert not (tmp_path / "bundle").exists()


def test_an_export_cut_short_leaves_the_previous_gguf_whole(tiny, tmp_path):
    """A write cut short (the file-size limit here: EFBIG part-way, as a full disk or a kill would) left half a GGUF
    beside the previous export's report, for `convert bundle` to pack; the previous GGUF now stays whole."""
    import subprocess
    import sys

    out = tmp_path / "model.gguf"
    convert_gpt(tiny.nanogpt_ckpt, out, "f16")
    before, report = out.read_bytes(), out.with_name("model.gguf.parity.json").read_text()
    code = ("import resource, sys\nfrom convert.gpt import convert_gpt\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before) // 2}, {len(before) // 2}))\n"
            "convert_gpt(sys.argv[1], sys.argv[2], 'q8_0')\n")
    failed = subprocess.run([sys.executable, "-c", code, str(tiny.nanogpt_ckpt), str(out)], capture_output=True, text=True)
    assert failed.returncode != 0 and "OSError" in failed.stderr, failed.stderr[-300:]  # numpy: "N requested and M written"
    assert out.read_bytes() == before and out.with_name("model.gguf.parity.json").read_text() == report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "model.gguf.parity.json"]  # no temp left


def test_a_bundle_refuses_a_truncated_gguf_the_device_would_refuse(tiny, bundle, tmp_path):
    """`convert bundle` checked only the hashes of what it wrote: a GGUF cut short (here one of another source, so
    no report of its own) was packed, exit 0, and only the device's `models install` refused it. The bundle is now
    opened as the device opens it: refused, naming the GGUF, and no manifest is left to load."""
    from edge_rag.models import bundle as B

    whole = tmp_path / "whole.gguf"
    convert_gpt(tiny.nanogpt_ckpt, whole, "f16")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(SystemExit, match=r"GGUF .*generator\.gguf"):
        main(["bundle", "--out", str(tmp_path / "bundle"), "--encoder", str(bundle.require(B.ROLE_ENCODER)),
              "--tokenizer", str(bundle.require(B.ROLE_TOKENIZER)), "--gguf", str(cut)])
    assert not (tmp_path / "bundle" / B.MANIFEST).exists()


def test_a_bundle_refuses_a_file_its_passing_report_was_not_of(tiny, bundle, tmp_path):
    """A report vouched for whatever file sat beside it: an unverified q8_0 export copied over a verified f16 one
    was packed on the f16's 'passed: true' (the manifest recording the f16's figures), as a GGUF renamed in by a run
    stopped before it wrote its report would be. The report holds its file's sha256; the bundle refuses another file."""
    from edge_rag.models import bundle as B

    gguf, other = tmp_path / "model.gguf", tmp_path / "other.gguf"
    assert convert_gpt(tiny.nanogpt_ckpt, gguf, "f16", verify_text=tiny.heldout.read_text(encoding="utf-8"),
                       **QUICK | {"verify_tokens": 256})["passed"]
    assert not convert_gpt(tiny.nanogpt_ckpt, other, "q8_0")["passed"]
    gguf.write_bytes(other.read_bytes())
    with pytest.raises(SystemExit, match=r"model\.gguf \(role generator\) is not the file its check was of"):
        main(["bundle", "--out", str(tmp_path / "bundle"), "--encoder", str(bundle.require(B.ROLE_ENCODER)),
              "--tokenizer", str(bundle.require(B.ROLE_TOKENIZER)), "--gguf", str(gguf)])
    assert not (tmp_path / "bundle").exists()


def test_own_exports_are_bundled_as_custom_not_as_gemma(bundle, tmp_path):
    """`convert bundle` of one's own exports without --profile wrote profile 'gemma' into the manifest, and
    `edge-rag models install` put the archive in the gemma bundle's place (the device's default), its health naming
    gemma. The manifest says custom unless --profile names another."""
    from edge_rag.models import bundle as B

    own = ["--encoder", str(bundle.require(B.ROLE_ENCODER)), "--tokenizer", str(bundle.require(B.ROLE_TOKENIZER)),
           "--gguf", str(bundle.require(B.ROLE_GENERATOR))]
    for given, recorded in (([], "custom"), (["--profile", "kiosk-2"], "kiosk-2")):
        assert main(["bundle", "--out", str(tmp_path / recorded), *own, *given]) == 0
        assert B.Bundle.load(tmp_path / recorded).manifest[B.KEY_PROFILE] == recorded


def test_own_exports_without_encoder_are_refused_not_ignored(tiny, bundle, tmp_path, capsys):
    """`convert bundle --gguf mine.gguf` (no --encoder) ignored the GGUF: it kept (or built) the profile's bundle and
    archived that, 'complete and verified', exit 0. It is a usage error now, naming the options, and nothing is
    archived."""
    from edge_rag.models import bundle as B

    profile = tmp_path / "profile"  # the profile's complete bundle, its files linked
    profile.mkdir()
    for f in bundle.files():
        (profile / f["name"]).symlink_to(bundle.root / f["name"])
    (profile / B.MANIFEST).write_bytes((bundle.root / B.MANIFEST).read_bytes())
    gguf = tmp_path / "mine.gguf"
    convert_gpt(tiny.nanogpt_ckpt, gguf, "f16")
    archive = tmp_path / "mine.tar"
    assert main(["bundle", "--gguf", str(gguf), "--dir", str(profile), "--archive", str(archive)]) == 2
    assert "--gguf: your own exports go with --encoder" in capsys.readouterr().err and not archive.exists()
