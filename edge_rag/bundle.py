"""The model bundle: a folder of model files described by ``manifest.json``.

Loading checks every file the manifest lists (present, right size, right sha256) and fails with a
BundleError naming the file, so a truncated download or a corrupt copy never reaches onnxruntime or
llama.cpp. Hashes of large files are re-computed only when a file's size or mtime changed since the
last successful check (recorded in ``.verified.json``), which keeps start-up fast on a Pi.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import models as M
from .errors import BundleError
from .fileio import atomic_write_text, sha256_file

MANIFEST = "manifest.json"
VERIFIED = ".verified.json"
FORMAT = "edge-rag-bundle"
# 2: the encoder's fp32 twin and torch reference vectors (on-device verify), roles and facts from
# edge_rag.models. A bundle of another version fails to load; `edge-rag models pull` rebuilds it.
FORMAT_VERSION = 2

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

# File roles (what each holds: edge_rag.models.ROLES).
ROLE_ENCODER = M.ENCODER_ROLE.name
ROLE_ENCODER_FP32 = M.ENCODER_FP32_ROLE.name
ROLE_TOKENIZER = M.TOKENIZER_ROLE.name
ROLE_GENERATOR = M.GENERATOR_ROLE.name
ROLE_REFERENCE = M.REFERENCE_ROLE.name
ROLE_ROUTER = M.ROUTER_ROLE.name
ROLE_READER = M.READER_ROLE.name
REQUIRED_ROLES = tuple(r.name for r in M.ROLES if r.required)


@dataclass(frozen=True)
class Bundle:
    """A verified bundle folder and its manifest."""

    root: Path
    manifest: dict

    @classmethod
    def load(cls, root: str | Path, verify: bool = True) -> Bundle:
        root = Path(root).expanduser()
        manifest_path = root / MANIFEST
        if not manifest_path.is_file():
            raise BundleError(
                f"no model bundle at {root} ({MANIFEST} missing); run `edge-rag models pull` to build one"
            )
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BundleError(f"{manifest_path} is not valid JSON ({exc}); rebuild the bundle") from exc
        if manifest.get(KEY_FORMAT) != FORMAT or manifest.get(KEY_FORMAT_VERSION) != FORMAT_VERSION:
            raise BundleError(
                f"{manifest_path} is {manifest.get(KEY_FORMAT)} v{manifest.get(KEY_FORMAT_VERSION)}, this edge-rag "
                f"reads {FORMAT} v{FORMAT_VERSION}; rebuild it (`edge-rag models pull`) or install a new archive"
            )
        roles = {f["role"] for f in manifest.get(KEY_FILES, [])}
        missing = [r for r in REQUIRED_ROLES if r not in roles]
        if missing:
            raise BundleError(f"{manifest_path} lists no file for role(s) {', '.join(missing)}")
        bundle = cls(root, manifest)
        if verify:
            bundle.verify()
        return bundle

    def files(self) -> list[dict]:
        return list(self.manifest[KEY_FILES])

    def path(self, role: str) -> Path | None:
        """Path of the file with this role, or None when the bundle has none (e.g. no router)."""
        for entry in self.files():
            if entry["role"] == role:
                return self.root / entry["name"]
        return None

    def require(self, role: str) -> Path:
        path = self.path(role)
        if path is None:
            raise BundleError(f"bundle {self.root} has no {role} file")
        return path

    @property
    def encoder(self) -> dict:
        return self.manifest[KEY_ENCODER]

    @property
    def generator(self) -> dict:
        return self.manifest[KEY_GENERATOR]

    def verify(self) -> None:
        """Check presence, size and sha256 of every file; raise BundleError naming the first bad one."""
        stamp_path = self.root / VERIFIED
        try:
            stamps = json.loads(stamp_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            stamps = {}
        fresh: dict[str, list] = {}
        for entry in self.files():
            path = self.root / entry["name"]
            if not path.is_file():
                raise BundleError(f"bundle file missing: {path} (role {entry['role']}); rebuild the bundle")
            stat = path.stat()
            if stat.st_size != entry["size"]:
                raise BundleError(
                    f"bundle file {path} is {stat.st_size} bytes, manifest says {entry['size']}"
                    " (truncated or replaced); rebuild the bundle"
                )
            key = [stat.st_size, stat.st_mtime_ns, entry["sha256"]]
            if stamps.get(entry["name"]) != key and sha256_file(path) != entry["sha256"]:
                raise BundleError(f"bundle file {path} fails its sha256 check (corrupt); rebuild the bundle")
            fresh[entry["name"]] = key
        if fresh != stamps:
            try:
                atomic_write_text(stamp_path, json.dumps(fresh))
            except OSError:
                pass  # a read-only bundle is fine: we just hash again next time


def file_entry(root: Path, name: str, role: str) -> dict:
    """Manifest entry for a file already in the bundle folder."""
    path = root / name
    return {"name": name, "role": role, "size": path.stat().st_size, "sha256": sha256_file(path)}


def write_manifest(root: str | Path, files: dict[str, str], **sections: object) -> Path:
    """Write ``manifest.json`` for ``files`` (role → file name inside ``root``) plus named sections.

    Sections are the manifest's descriptive parts (``profile``, ``encoder``, ``generator``, ``router``,
    ``reader``, ``versions``); the file list with sizes and hashes is computed here so it cannot drift.
    Called only by the host-side builder (``convert.bundle.assemble``).
    """
    root = Path(root)
    manifest = {
        KEY_FORMAT: FORMAT,
        KEY_FORMAT_VERSION: FORMAT_VERSION,
        **sections,
        KEY_FILES: [file_entry(root, name, role) for role, name in files.items()],
    }
    path = root / MANIFEST
    atomic_write_text(path, json.dumps(manifest, indent=2) + "\n")
    return path
