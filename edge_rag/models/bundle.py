"""The model bundle: a folder of model files described by ``manifest.json``.

Loading checks every file the manifest lists (present, right size, right sha256) and fails with a
BundleError naming the file, so a truncated download or a corrupt copy never reaches onnxruntime or
llama.cpp. A full sha256 pass over a 300 MB GGUF takes seconds on a Pi, so ``.verified.json`` records
each file's identity at its last full check (size, mtime, ctime, inode — ctime cannot be set back by a
program that edits a file and restores its mtime) and a CRC32 per 1 MiB block. A file whose identity
changed is hashed in full; otherwise every load re-checks every block's CRC32, which catches bit rot on
an SD card anywhere in a file (CRC32 detects every error burst of up to 32 bits in a block, so any one
flipped byte) at about 2 GB/s: ~0.2 s for the gemma bundle's 390 MB from the page cache here; a file whose block
fails is hashed in full, and only a sha256 that differs from the manifest's fails it (the stamps may rot too). A full
sha256 pass runs again after ``FULL_VERIFY_INTERVAL_S`` or on request (``Bundle.verify_files(full=True)``).
A process that loads the same bundle again within ``RECHECK_S`` of a load that passed, every file's identity
unchanged, skips the blocks: they would come from the page cache the last check filled, so the re-read could not
see the disk rot (a training or benchmark run opens the bundle dozens of times; one open costs ~0.2 s of CRCs).
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import BundleError
from ..storage.fileio import atomic_write_text, sha256_file
from . import registry as M
from .manifest import (  # noqa: F401 - the KEY_* names are re-exported: callers spell them bundle.KEY_*
    KEY_ENCODER,
    KEY_FILES,
    KEY_FORMAT,
    KEY_FORMAT_VERSION,
    KEY_GENERATOR,
    KEY_PROFILE,
    KEY_READER,
    KEY_ROUTER,
    KEY_VERSIONS,
    check_manifest,
    read_json,
    valid_stamps,
)

MANIFEST = "manifest.json"
VERIFIED = ".verified.json"
VERIFIED_VERSION = 3  # 3: a CRC32 per block, all checked at every load (2: blake2b, 4 sampled blocks)
BLOCK_BYTES = 1 << 20  # unit of the per-load check
FULL_VERIFY_INTERVAL_S = 7 * 24 * 3600  # a full sha256 pass at least this often
RECHECK_S = 60.0  # a load this soon after a passing one of the very same files in this process checks no blocks
SETTLED_NS = 2_000_000_000  # a file changed this recently is not remembered as checked (FAT keeps times to 2 s)
_passed: dict[tuple, float] = {}  # files' identity at a passing per-load check → when (time.monotonic)
_passed_lock = threading.Lock()
FORMAT = "edge-rag-bundle"
# 2: the encoder's fp32 twin and torch reference vectors (on-device verify), roles and facts from
# edge_rag.models.registry. A bundle of another version fails to load; `edge-rag models pull` rebuilds it.
FORMAT_VERSION = 2


# File roles (what each holds: edge_rag.models.registry.ROLES).
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
                f"no model bundle at {root} ({MANIFEST} missing): install one (`edge-rag models install "
                "ARCHIVE.tar`), or build it here (`edge-rag models pull --profile PROFILE`, needs torch)"
            )
        manifest = read_json(manifest_path, "a bundle manifest")
        if isinstance(manifest, dict) and (manifest.get(KEY_FORMAT) != FORMAT
                                           or manifest.get(KEY_FORMAT_VERSION) != FORMAT_VERSION):
            raise BundleError(
                f"{manifest_path} is {str(manifest.get(KEY_FORMAT))[:40]} v{str(manifest.get(KEY_FORMAT_VERSION))[:8]}"
                f", this edge-rag reads {FORMAT} v{FORMAT_VERSION}; rebuild it (`edge-rag models pull`) or install a "
                "new archive"
            )
        manifest = check_manifest(manifest, manifest_path)
        roles = {f["role"] for f in manifest[KEY_FILES]}
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

    def sha256(self, role: str) -> str:
        """The manifest's sha256 of the file with this role (BundleError when the bundle has none)."""
        self.require(role)
        return next(str(f["sha256"]) for f in self.files() if f["role"] == role)

    def require(self, role: str) -> Path:
        path = self.path(role)
        if path is None:
            raise BundleError(f"bundle {self.root} has no {role} file")
        return path

    def current(self, role: str) -> Path:
        """The file of ``role`` for a model loaded on first use, maybe long after the bundle: hashed again unless the
        stamps record this very file (size, times, inode) as checked against this manifest's sha256, so a bundle
        installed in this one's place meanwhile is never loaded under the manifest this process holds."""
        path, entry = self.require(role), next(f for f in self.files() if f["role"] == role)
        try:
            stamp = valid_stamps(read_json(self.root / VERIFIED, "a stamp file"), VERIFIED_VERSION)["files"][entry["name"]]
            s = path.stat()
            if stamp["key"] == [s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, entry["sha256"]]:
                return path
        except (BundleError, OSError, KeyError):
            pass
        try:
            self.verify_files()
        except BundleError as exc:
            raise BundleError(f"{exc} (it changed since this process loaded the bundle: restart to load the bundle "
                              "there now)") from None
        return path

    @property
    def encoder(self) -> dict:
        return self.manifest[KEY_ENCODER]

    @property
    def generator(self) -> dict:
        return self.manifest[KEY_GENERATOR]

    def verify(self) -> None:
        """The check at every load (``verify_files``), skipped within ``RECHECK_S`` of one in this process that
        passed on the very same files: same manifest entries, every file's size, mtime, ctime and inode unchanged (an
        edit through the file system changes its ctime, which no program can set back)."""
        settled, now, before = time.time_ns() - SETTLED_NS, time.monotonic(), self._identity()
        with _passed_lock:
            if before is not None and now - _passed.get(before, -RECHECK_S) < RECHECK_S:
                return
        self.verify_files(full=False)
        if before is not None and before == self._identity() and max(before[2], default=settled) < settled:
            with _passed_lock:
                for stale in [k for k, t in _passed.items() if now - t >= RECHECK_S]:
                    del _passed[stale]
                _passed[before] = now

    def _identity(self) -> tuple | None:
        """The bundle's files as the manifest lists them and as they are on disk now (None: one is missing)."""
        try:
            stats = [(self.root / f["name"]).stat() for f in self.files()]
        except OSError:
            return None
        return (str(self.root.resolve()), repr(self.files()),
                tuple(s.st_ctime_ns for s in stats), tuple((s.st_size, s.st_mtime_ns, s.st_ino, s.st_dev) for s in stats))

    def verify_files(self, full: bool = False) -> dict[str, str]:
        """Check presence, size and content of every file; raise BundleError naming the first bad one.

        ``full`` hashes every file (sha256); otherwise only files changed since their last full check
        are, the others get every block's CRC32 checked (and a full pass if the last is older than
        ``FULL_VERIFY_INTERVAL_S``). Returns file name → how it was checked."""
        stamp_path = self.root / VERIFIED
        try:
            stamps = valid_stamps(read_json(stamp_path, "a stamp file"), VERIFIED_VERSION)
        except BundleError:  # absent, unreadable or not JSON: a cache only, rebuilt by hashing every file
            stamps = {}
        known = stamps.get("files", {})
        # a last pass in the future was stamped by a clock set wrong ahead (no RTC, a bad NTP fix): due now, not then
        full = full or not 0 <= time.time() - stamps.get("full_at", 0) <= FULL_VERIFY_INTERVAL_S
        files: dict[str, dict] = {}
        checked: dict[str, str] = {}
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
            key = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, entry["sha256"]]
            old, bad = known.get(entry["name"], {}), None
            if not full and old.get("key") == key and len(old["blocks"]) == -(-stat.st_size // BLOCK_BYTES):
                if (bad := _bad_block(path, old["blocks"])) is None:
                    checked[entry["name"]] = f"{len(old['blocks'])} blocks (crc32)"
                    files[entry["name"]] = old
                    continue
            # A block that fails may be the stamp's (a cache on the same card): the manifest's sha256 decides
            digest, blocks = _hash_blocks(path)
            if digest != entry["sha256"] and bad is not None:
                raise BundleError(f"bundle file {path}: block {bad} changed since its last full check (bit rot or "
                                  "an edit that kept the file's times); rebuild the bundle")
            if digest != entry["sha256"]:
                raise BundleError(f"bundle file {path} fails its sha256 check (corrupt); rebuild the bundle")
            files[entry["name"]] = {"key": key, "blocks": blocks}
            checked[entry["name"]] = "sha256"
        fresh = {"version": VERIFIED_VERSION, "full_at": time.time() if full else stamps.get("full_at", time.time()),
                 "files": files}
        if files != known or full:
            try:
                atomic_write_text(stamp_path, json.dumps(fresh))
            except OSError:
                pass  # a read-only bundle is fine: we just hash again next time
        return checked


def _hash_blocks(path: Path) -> tuple[str, list[int]]:
    """sha256 of the file and the CRC32 of each BLOCK_BYTES block, in one read."""
    digest, blocks = hashlib.sha256(), []
    with open(path, "rb") as f:
        while block := f.read(BLOCK_BYTES):
            digest.update(block)
            blocks.append(zlib.crc32(block))
    return digest.hexdigest(), blocks


def _bad_block(path: Path, blocks: list[int]) -> int | None:
    """The first block whose CRC32 differs from the last full check's (None: none): bit rot anywhere is caught."""
    with open(path, "rb") as f:
        for i, crc in enumerate(blocks):
            if zlib.crc32(f.read(BLOCK_BYTES)) != crc:
                return i
    return None


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
