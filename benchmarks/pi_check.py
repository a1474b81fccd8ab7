"""`make pi-check`: the device side installed and run on an emulated Raspberry Pi / Jetson CPU (qemu-aarch64).

In an aarch64 environment built from the registries (``convert.aarch64``), as a device would:
``edge-rag models install ARCHIVE`` on a Cortex-A72 (hashes + the int8 encoder gate on ARM NEON kernels),
``edge-rag models verify --full`` on a Cortex-A76 (dotprod kernels), the int8 reader on both CPUs against
the x86 reads of the same file (``convert.reader``'s gates), the sample corpus indexed and the demo questions
plus GPT-route questions answered on both CPUs (same answers, or the differences listed), and the torch-free
test files. The demo questions take the product's default (the certified decision, which never generates) on
both CPUs; the GPT-route questions take the seed decision (``ask --seed-decision``), which generates for them. Emulated time says nothing about a device, so the report gives none: peak RSS (real; it is
the emulator process's, guest and emulator together) and work counts.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from convert import aarch64

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "edge_rag" / "sample"
# Open questions the seed decision (``ask --seed-decision``) routes to GPT on x86; the certified default does not.
GPT_QUESTIONS = ("Tell me about Big Mary", "What can children do at the museum?")
COMPARED = ("answer", "route", "tier", "refusal_reason")
# Torch-free test files that fit under emulation (none indexes a whole corpus); they use the installed bundle.
# What TEST_FILES need beyond the runtime: pytest, and scipy, test_certify's reference (its tests skip without it).
TEST_TOOLS = ("pytest", f"scipy=={metadata.version('scipy')}")
READER_CPUS = ("cortex-a72", "cortex-a76")  # NEON only (Pi 4); dotprod (Pi 5, as a Jetson Orin's A78AE)
TEST_FILES = ("test_chunk.py", "test_bounds.py", "test_gate.py", "test_certify.py", "test_cache.py", "test_config.py",
              "test_compress.py", "test_reader.py")


@dataclass
class Step:
    """One command on one CPU: exit code, output, and the process's peak RSS (``benchmarks.pi_device``)."""

    cpu: str
    args: list[str]
    returncode: int
    out: str
    err: str
    peak_rss_mb: float | None

    def check(self) -> Step:
        if self.returncode != 0:
            raise RuntimeError(f"{self.cpu}: `{' '.join(self.args)}` exited {self.returncode}:\n"
                             f"{self.out[-2000:]}\n{self.err[-3000:]}")
        return self


def _step(cpu: str, cmd: list[str], args: list[str], env: dict, cwd: Path) -> Step:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    lines = done.stderr.rstrip().splitlines()
    rss = json.loads(lines[-1])["peak_rss_mb"] if lines and lines[-1].startswith('{"peak_rss_mb"') else None
    return Step(cpu, args, done.returncode, done.stdout, "\n".join(lines[:-1] if rss else lines), rss)


def on_device(env: aarch64.Env, home: Path, *args: str, cpu: str | None = None) -> Step:
    """``python -m benchmarks.pi_device ARGS`` under qemu-aarch64 with ``home`` as EDGE_RAG_HOME. The working
    folder is ``home``: the checkout must not shadow the installed package."""
    home.mkdir(parents=True, exist_ok=True)
    cmd = env.command("-m", "benchmarks.pi_device", *args, cpu=cpu)
    return _step(f"aarch64 {cpu or env.cpu}", cmd, list(args), env.environ(EDGE_RAG_HOME=str(home)), home)


def on_host(home: Path, *args: str) -> Step:
    """The same command natively, from this checkout's environment."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "EDGE_RAG_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return _step("x86_64", [sys.executable, "-m", "benchmarks.pi_device", *args], list(args), env, home)


def answers(out: str) -> list[dict]:
    """The Answer objects ``edge-rag ask --json`` printed, one after another."""
    decoder, found, text = json.JSONDecoder(), [], out.strip()
    while text:
        answer, end = decoder.raw_decode(text)
        found.append(answer)
        text = text[end:].lstrip()
    return found


def compared(answer: dict, key: str) -> object:
    """A field as the CPUs must agree on it: a refusal reason without its numbers (it quotes the score, which each
    CPU's int8 kernels round a little differently: 0.39 on one, 0.40 on the other); its kind and the decision stay."""
    value = answer.get(key)
    return re.sub(r"\d+(\.\d+)?", "#", value) if key == "refusal_reason" and value else value


def differences(x86: list[dict], arm: list[dict]) -> list[dict]:
    """Per question, the fields of ``COMPARED`` whose values differ between the two CPUs."""
    differ = [[k for k in COMPARED if compared(a, k) != compared(b, k)] for a, b in zip(x86, arm)]
    return [{"question": a["question"], **{k: [a.get(k), b.get(k)] for k in keys}}
            for a, b, keys in zip(x86, arm, differ) if keys]


def install_and_ask(env: aarch64.Env, work: Path, archive: Path, docs: list[Path], questions: list[str],
                    gpt_questions: tuple[str, ...] = ()) -> dict:
    """Install ``archive``, index ``docs`` and ask ``questions`` (default config) on x86 and on the emulated
    device; ``gpt_questions`` are asked with the seed decision (``result["gpt"]``, same keys)."""
    steps: dict[str, Step] = {}
    for cpu, run in (("x86_64", lambda home, *a: on_host(home, *a)),
                     ("aarch64", lambda home, *a: on_device(env, home, *a))):
        home = work / cpu
        steps[f"install {cpu}"] = run(home, "edge_rag", "models", "install", str(archive), "--threads", "1").check()
        steps[f"index {cpu}"] = run(home, "edge_rag", "index", *map(str, docs), "--db", str(home / "db"),
                                    "--quiet").check()
        steps[f"ask {cpu}"] = run(home, "edge_rag", "ask", "--json", "--temperature", "0", "--db", str(home / "db"),
                                  *questions).check()
        if gpt_questions:
            steps[f"gpt {cpu}"] = run(home, "edge_rag", "ask", "--json", "--temperature", "0", "--seed-decision",
                                      "--db", str(home / "db"), *gpt_questions).check()
    result = _compared(steps, "ask")
    if gpt_questions:
        result["gpt"] = _compared(steps, "gpt")
    return {"steps": steps, **result}


def _compared(steps: dict[str, Step], name: str) -> dict:
    x86, arm = answers(steps[f"{name} x86_64"].out), answers(steps[f"{name} aarch64"].out)
    return {"x86": x86, "aarch64": arm, "differences": differences(x86, arm)}


def not_generated(result: dict) -> list[str]:
    """The GPT-route questions that did not take the GPT route or generated nothing, on either CPU."""
    return [f"{cpu}: {a['question']!r} route {a['route']}, {a['completion_tokens']} tokens"
            for cpu in ("x86", "aarch64") for a in result["gpt"][cpu]
            if a["route"] != "GPT" or a["completion_tokens"] < 1 or not a["answer"]]


def reader_reference(home: Path, bundle: Path, n: int) -> Path:
    """x86 reads of the bundle's int8 reader on ``n`` reader-val inputs (answerable with the gold paragraph,
    unanswerable with another), written where ``convert.reader --reference`` reads them."""
    from convert import reader as R
    from convert import reader_data as D

    pool = D.reader_val()  # negatives from the whole split: few of its first questions have one in their article
    val = pool[: n // 2]
    inputs = R.sample_inputs(val, D.negative_pairs(pool, 0)[: n - len(val)])
    x86 = R.onnx_reads(bundle / "reader.onnx", bundle / "tokenizer.json", inputs, threads=1)
    reference = home / "reader-reference.json"
    reference.write_text(json.dumps({"inputs": inputs, "torch": x86}))  # "torch": the key convert.reader reads
    return reference


def reader_parity(env: aarch64.Env, home: Path, bundle: Path, reference: Path, cpu: str) -> tuple[dict, Step]:
    """The bundle's int8 reader on ``cpu``'s ARM kernels against its x86 reads, judged by ``convert.reader``'s
    int8 gates."""
    step = on_device(env, home, "convert.reader", "--reference", str(reference), "--onnx", str(bundle / "reader.onnx"),
                     "--tokenizer", str(bundle / "tokenizer.json"), "--threads", "1", cpu=cpu)
    last = (step.out.strip().splitlines() or [""])[-1]  # exit 1 with a verdict line: the gate failed, reported
    if not last.startswith("{"):
        raise RuntimeError(f"{step.cpu}: convert.reader printed no verdict (exit {step.returncode}):\n{step.err[-3000:]}")
    return json.loads(last), step


def verdict_line(step: Step) -> str:
    """The encoder verdict ``models install``/``verify`` printed, without its (emulated) query time."""
    line = next(line for line in step.out.splitlines() if line.startswith(("int8 encoder", "fp32 encoder")))
    return re.sub(r", query [0-9.]+ ms", "", line)


def work_counts(answered: list[dict]) -> list[str]:
    rows = [f"| {a['question']} | {a['route']} / {a['tier']} | {a['n_evidence']} | {len(a['passages'])} | "
            f"{a['context_chars']} | {a['prompt_tokens']} | {a['completion_tokens']} |" for a in answered]
    return ["| question | route / tier | evidence passages | passages used | context chars | prompt tokens | "
            "generated tokens |", "|---|---|---|---|---|---|---|", *rows]


def _listed(compared: dict) -> str:
    arm = compared["aarch64"]
    answered = sum(a["answer"] is not None for a in arm)
    return (f"{len(arm)} questions ({answered} answered, {len(arm) - answered} refused on aarch64), "
            f"{len(compared['differences'])} differ from x86"
            + "".join(f"\n  - {json.dumps(d)}" for d in compared["differences"]))


def report(result: dict, started: float) -> str:
    steps: dict[str, Step] = result["steps"]
    lines = ["# pi-check: edge-rag on an emulated aarch64 CPU (qemu-aarch64)", "",
             f"Host wall time {time.time() - started:.0f} s (emulated: no latency is reported).", "",
             "## Checks", "",
             f"- `models install` ({steps['install aarch64'].cpu}): {verdict_line(steps['install aarch64'])}",
             f"- `models verify --full` ({steps['verify'].cpu}): {verdict_line(steps['verify'])}"]
    lines += [f"- reader int8 ({steps[f'reader {cpu}'].cpu}) vs x86 reads: {json.dumps(result['reader'][cpu])}"
              for cpu in READER_CPUS]
    lines += [f"- demo questions, default (certified) decision: {_listed(result)}",
              f"- GPT-route questions, seed decision (`ask --seed-decision`): {_listed(result['gpt'])}"]
    lines += [f"  - {a['question']!r}: x86 {a['answer']!r} ({a['completion_tokens']} tokens) | aarch64 "
              f"{b['answer']!r} ({b['completion_tokens']} tokens)" for a, b in zip(result["gpt"]["x86"],
                                                                                     result["gpt"]["aarch64"])]
    lines += [f"- tests under emulation: {result['tests']}", "", "## Peak RSS (MB)", "",
              "| step | x86_64 (native) | aarch64 (qemu-user: guest + emulator) |", "|---|---|---|"]
    for name in ("install", "index", "ask", "gpt"):
        lines.append(f"| {name} | {steps[f'{name} x86_64'].peak_rss_mb} | {steps[f'{name} aarch64'].peak_rss_mb} |")
    lines += [f"| {name} | | {steps[name].peak_rss_mb} |" for name in
              ("verify", *[f"reader {cpu}" for cpu in READER_CPUS], "tests")]
    lines += ["", "## Work counts (aarch64)", "", f"Index: {steps['index aarch64'].out.strip()}", "",
              *work_counts(result["aarch64"] + result["gpt"]["aarch64"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pi_check", description=__doc__)
    p.add_argument("--archive", type=Path, required=True, help="bundle archive (`make bundle`)")
    p.add_argument("--out", type=Path, default=ROOT / "pi-check", help="work folder and report.md")
    p.add_argument("--reader-inputs", type=int, default=20)
    args = p.parse_args(argv)
    missing = aarch64.missing_tools()
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}: `make system-packages` installs them (root + apt)")
    try:
        return check(args.archive.resolve(), args.out.resolve(), args.reader_inputs)
    except RuntimeError as exc:  # a failed build or device step, with its own output
        print(f"pi-check failed: {exc}", file=sys.stderr)
        return 1


def check(archive: Path, work: Path, reader_inputs: int) -> int:
    """Every step of the module docstring; writes ``work``/report.md and pi-check.json."""
    started = time.time()
    shutil.rmtree(work, ignore_errors=True)
    env = aarch64.install(work / "site", llama=True, extra=TEST_TOOLS)
    questions = [q["question"] for q in json.loads((SAMPLE / "questions.json").read_text())]
    result = install_and_ask(env, work, archive, [SAMPLE / "docs"], questions, GPT_QUESTIONS)
    missing = not_generated(result)
    if missing:
        raise RuntimeError(f"the seed decision did not generate for: {'; '.join(missing)}")
    home, steps = work / "aarch64", result["steps"]
    bundle = home / "bundles" / "gemma"
    steps["verify"] = on_device(env, home, "edge_rag", "models", "verify", "--full", "--threads", "1",
                                cpu="cortex-a76").check()
    reference, result["reader"] = reader_reference(home, bundle, reader_inputs), {}
    for cpu in READER_CPUS:
        result["reader"][cpu], steps[f"reader {cpu}"] = reader_parity(env, home, bundle, reference, cpu)
    steps["tests"] = on_device(env, home, "pytest", "-q", "-p", "no:cacheprovider",
                               *[str(ROOT / "tests" / f) for f in TEST_FILES])
    result["tests"] = re.sub(r" in [0-9.]+s.*", "", steps["tests"].out.strip().splitlines()[-1])  # no emulated time
    text = report(result, started)
    (work / "report.md").write_text(text)
    (work / "pi-check.json").write_text(json.dumps(
        {**{k: v for k, v in result.items() if k != "steps"}, "steps": {k: asdict(s) for k, s in steps.items()}},
        indent=2))
    print(text)
    failed = steps["tests"].returncode != 0 or not all(r["pass"] for r in result["reader"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
