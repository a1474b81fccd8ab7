"""Measure int8 schemes on several CPU kernel paths: native and emulated CPUs under qemu-user.

``python -m convert kernels MODEL_DIR --out DIR`` exports the fp32 encoder, writes one int8 file per
scheme (``convert.quantize.SCHEMES``) and torch's reference vectors, then runs ``edge_rag.models.verify`` on
every file natively and under ``qemu-x86_64 -cpu <model>`` (and, with ``--aarch64``, under
``qemu-aarch64 -cpu cortex-a72/-a76`` in the environment of ``convert.aarch64``): same sentences, same
thresholds as ``edge-rag models verify`` on a device. Only the probe runs under emulation, and it imports
no torch.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from edge_rag.models.verify import verify_encoder
from edge_rag.storage.fileio import atomic_write_text

from .args import model_folder

ROOT = Path(__file__).resolve().parent.parent


def prepare(model_dir: Path, out: Path, sentences: int, squad: Path | None) -> list[Path]:
    """fp32 export + one int8 file per scheme + reference.npz in ``out`` (host, torch)."""
    from edge_rag.models.verify import save_reference
    from edge_rag.retrieval.encode import Encoder

    from .encoder import export_fp32, load_torch, parity_texts, torch_embed
    from .quantize import SCHEMES, quantize_int8

    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_dir / "tokenizer.json", out / "tokenizer.json")
    model = load_torch(model_dir)
    export_fp32(model, out / "fp32.onnx")
    texts = parity_texts(ROOT / "edge_rag" / "sample" / "docs", squad, sentences)
    encoder = Encoder(out / "fp32.onnx", out / "tokenizer.json")
    save_reference(out / "reference.npz", texts, torch_embed(model, encoder, texts))
    for name in SCHEMES:
        quantize_int8(out / "fp32.onnx", out / f"{name}.onnx", name)
    return [out / "fp32.onnx"] + [out / f"{name}.onnx" for name in SCHEMES]


def probe(files: list[Path], out: Path, threads: int, repeats: int) -> list[dict]:
    """Verify each file on this CPU (runs under emulation; no torch)."""
    rows = []
    for path in files:
        precision = "fp32" if path.stem == "fp32" else "int8"
        verdict = verify_encoder(path, out / "tokenizer.json", out / "reference.npz", precision, threads=threads,
                                 repeats=repeats)
        rows.append({"scheme": path.stem, **verdict.__dict__})
    return rows


def run_on(python: list[str], files: list[Path], out: Path, threads: int, env: dict | None = None) -> list[dict]:
    """The probe run by ``python`` (a command line: native, or an emulator + interpreter)."""
    cmd = [*python, "-m", "convert.kernels", "--probe", str(out), "--threads", str(threads),
           "--repeats", "20" if python == [sys.executable] else "3", *[str(f) for f in files]]  # emulated: means little
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if result.returncode != 0:
        raise SystemExit(f"probe failed ({' '.join(cmd[:4])}): {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def table(results: dict[str, list[dict]]) -> str:
    lines = ["| CPU (kernel path) | scheme | cosine mean | cosine min | NN@5 | top-5 | query ms | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for label, rows in results.items():
        for r in rows:
            lines.append(f"| {label} ({r['cpu']}) | {r['scheme']} | {r['cosine_mean']:.4f} | {r['cosine_min']:.4f} | "
                         f"{r['nn_at5']:.3f} | {r['top5']:.3f} | {r['query_ms']:.1f} | "
                         f"{'pass' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    files = prepare(model_folder(args.model_dir), out, args.sentences, Path(args.squad) if args.squad else None)
    results = {"native": run_on([sys.executable], files, out, args.threads)}
    for cpu in filter(None, args.qemu_cpus.split(",")):
        results[f"qemu -cpu {cpu}"] = run_on(["qemu-x86_64", "-cpu", cpu, sys.executable], files, out, args.threads)
    if args.aarch64:
        from . import aarch64

        env = aarch64.install(out / "aarch64-site", llama=False)
        for cpu in aarch64.CPUS:  # cwd is the checkout: the probe is this checkout's, the libraries aarch64's
            results[f"qemu-aarch64 -cpu {cpu}"] = run_on(env.command(cpu=cpu), files, out, args.threads,
                                                         env.environ())
    atomic_write_text(out / "kernels.json", json.dumps(results, indent=2))
    print(table(results))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kernels", help="measure int8 schemes natively and under qemu CPU models")
    p.add_argument("model_dir", help="sentence-transformers folder (config.json, safetensors, tokenizer.json)")
    p.add_argument("--out", required=True, help="work folder (models, reference.npz, kernels.json)")
    p.add_argument("--sentences", type=int, default=100, help="sentences each file is checked and timed on")
    p.add_argument("--squad", help="SQuAD JSON whose contexts give the sentences (default: the sample docs)")
    p.add_argument("--qemu-cpus", default="Haswell,Nehalem", help="qemu-x86_64 -cpu models, comma-separated")
    p.add_argument("--aarch64", action="store_true",
                   help="also under qemu-aarch64 (Cortex-A72 and -A76) in an arm64 Debian python (convert.aarch64)")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime threads of each probe")
    p.set_defaults(func=run)


def _probe_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--probe", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("files", nargs="+")
    a = p.parse_args(argv)
    print(json.dumps(probe([Path(f) for f in a.files], Path(a.probe), a.threads, a.repeats)))


if __name__ == "__main__":
    _probe_main(sys.argv[1:])
