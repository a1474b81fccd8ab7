"""What a bundle's ``manifest.json`` and its ``.verified.json`` stamps must hold, checked before anything uses them.

A manifest is input like any other: a hand edit, a truncated copy or a hostile archive must fail with one
BundleError naming the file and the field, never a traceback, and must never make a load read a file outside
the bundle folder (a file name is one plain path component). The stamp file is only a cache of the last full
check: one of the wrong shape is ignored, so every file is hashed in full again and the stamps rewritten.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..errors import BundleError
from . import registry as M

# Manifest keys (top level).
KEY_FORMAT = "format"
KEY_FORMAT_VERSION = "format_version"
KEY_PROFILE = "profile"
KEY_FILES = "files"
KEY_ENCODER = "encoder"
KEY_GENERATOR = "generator"
KEY_ROUTER = "router"
KEY_READER = "reader"
KEY_VERSIONS = "versions"

MAX_JSON_BYTES = 4 << 20  # a manifest is ~2 KB, the stamps ~1 KB per 100 MB of model: far above either
ENCODER_PRECISIONS = ("fp32", "int8")  # verify.THRESHOLDS has one entry per precision
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a folder name under the bundles home
# Fields the runtime reads from each section: (type, required). Other fields are descriptive and left as they are.
SECTIONS: dict[str, dict[str, tuple[type, bool]]] = {
    KEY_ENCODER: {"dim": (int, True), "max_seq_len": (int, False), "heads": (int, False), "ffn": (int, False),
                  "name": (str, False), "precision": (str, False)},
    KEY_GENERATOR: {"name": (str, False), "prompt_style": (str, False)},
}
OPTIONAL_SECTIONS = (KEY_ROUTER, KEY_READER, KEY_VERSIONS)
FIXES = "; rebuild the bundle (`edge-rag models pull`) or install its archive again"


def read_json(path: Path, what: str) -> object:
    """The JSON in ``path`` (at most MAX_JSON_BYTES), or BundleError naming ``what`` is wrong with it."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise BundleError(f"cannot read {what} {path}: {exc.strerror}") from None
    if len(raw) > MAX_JSON_BYTES:
        raise BundleError(f"{path} is over {MAX_JSON_BYTES >> 20} MB: not {what}{FIXES}")
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise BundleError(f"{path} is not valid JSON ({str(exc)[:120]}){FIXES}") from None


def check_manifest(manifest: object, path: Path) -> dict:
    """``manifest`` if it is a dict with a valid file list and the sections the runtime reads, else BundleError."""
    if not isinstance(manifest, dict):
        kind = {list: "a list", str: "a string", type(None): "null"}.get(type(manifest), "a number")
        raise BundleError(f"{path} holds {kind} where a JSON object is expected{FIXES}")
    _check_files(manifest.get(KEY_FILES), path)
    for section, fields in SECTIONS.items():
        _check_section(manifest.get(section), section, fields, path)
    for section in OPTIONAL_SECTIONS:
        if not isinstance(manifest.get(section, {}), dict):
            raise BundleError(f"{path}: '{section}' must be an object{FIXES}")
    profile = manifest.get(KEY_PROFILE, "custom")
    if not isinstance(profile, str) or not PROFILE_NAME.fullmatch(profile):
        raise BundleError(f"{path}: profile {str(profile)[:40]!r} is not a name (letters, digits, . _ -){FIXES}")
    if manifest[KEY_ENCODER].get("precision", "fp32") not in ENCODER_PRECISIONS:
        raise BundleError(f"{path}: encoder precision must be one of {', '.join(ENCODER_PRECISIONS)}{FIXES}")
    if manifest[KEY_GENERATOR].get("prompt_style", M.PROMPT_STYLES[0]) not in M.PROMPT_STYLES:
        raise BundleError(f"{path}: generator prompt_style must be one of {', '.join(M.PROMPT_STYLES)}{FIXES}")
    return manifest


def _check_files(files: object, path: Path) -> None:
    """A list of entries with a plain file name (no folder, not absolute, no ``..``), a role, a size, a sha256."""
    if not isinstance(files, list):
        raise BundleError(f"{path}: '{KEY_FILES}' must be a list of file entries{FIXES}")
    for n, entry in enumerate(files):
        fields = {"name": str, "role": str, "size": int, "sha256": str}
        bad = [k for k, kind in fields.items() if not isinstance(entry, dict) or not isinstance(entry.get(k), kind)]
        if bad:
            raise BundleError(f"{path}: file entry {n} lacks a valid {', '.join(bad)}{FIXES}")
        if not plain_name(entry["name"]):
            raise BundleError(f"{path}: file entry {n} names {entry['name'][:80]!r}, not a file inside the bundle "
                              f"folder (absolute, in a subfolder or with '..'){FIXES}")


def plain_name(name: str) -> bool:
    """Whether ``name`` is one path component that stays inside the folder it is joined to."""
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\x00")


def _check_section(section: object, key: str, fields: dict[str, tuple[type, bool]], path: Path) -> None:
    if not isinstance(section, dict):
        raise BundleError(f"{path}: the '{key}' section is {'missing' if section is None else 'not an object'}"
                          f"{FIXES}")
    for name, (kind, required) in fields.items():
        value = section.get(name)
        if value is None and not required:
            continue
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and isinstance(value, int) and value <= 0):
            want = "a positive integer" if kind is int else "a string"
            raise BundleError(f"{path}: '{key}.{name}' must be {want}, not {json.dumps(value)[:40]}{FIXES}")


def valid_stamps(stamps: object, version: int) -> dict:
    """``stamps`` if they are stamps of this ``version``: ``full_at`` a time, ``files`` name → {key: list,
    blocks: list of CRC32s}; otherwise {} (every file is hashed in full again)."""
    if not isinstance(stamps, dict) or stamps.get("version") != version:
        return {}
    full_at, files = stamps.get("full_at"), stamps.get("files")
    if not isinstance(full_at, (int, float)) or isinstance(full_at, bool) or not math.isfinite(full_at):
        return {}
    if not isinstance(files, dict) or not all(_valid_stamp(s) for s in files.values()):
        return {}
    return stamps


def _valid_stamp(stamp: object) -> bool:
    return (isinstance(stamp, dict) and isinstance(stamp.get("key"), list) and isinstance(stamp.get("blocks"), list)
            and all(isinstance(b, int) and not isinstance(b, bool) for b in stamp["blocks"]))
