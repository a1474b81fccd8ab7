"""Device side of "host builds, device installs": install a bundle archive, or build where torch is.

``edge-rag models install ARCHIVE`` unpacks the archive beside its destination, checks every file's
sha256 against the manifest, verifies the encoder on this CPU, and only then renames the folder into
place, so a failed install leaves the previous default bundle untouched. ``edge-rag models pull``
builds a bundle in a subprocess (``python -m convert bundle``: torch stays out of this process) where
the convert extra is installed, and otherwise says what to run on a host.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from ..errors import BundleError
from ..storage.fileio import fsync_dir
from . import bundle as B
from . import registry as M
from .verify import Verdict, check_models, verify_bundle

HOST_STEPS = ("on a host with the convert extra (pip install 'edge-rag[convert]'): "
              "`python -m convert bundle --profile {profile} --archive edge-rag-{profile}.tar` (or `make bundle`); "
              "copy the archive here and run `edge-rag models install edge-rag-{profile}.tar`")
KEEP_FREE_BYTES = 64 << 20  # an install refused rather than leave less free: the stores and logs must commit
LEFT_BEHIND = re.compile(r"\.install-[0-9a-f]{8}|\.(.+)\.old-[0-9a-f]{8}")  # a killed install's folders (below)
EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
MAX_EXTENDED_BYTES = 64 << 10  # a long name or pax records: a bundle archive's are a few dozen bytes
AT_FDCWD, RENAME_EXCHANGE = -100, 2  # <fcntl.h>, <linux/fs.h>
BUNDLE_NAMES = frozenset({B.MANIFEST, B.VERIFIED, *(role.file for role in M.ROLES)})  # all a bundle folder holds


def install(archive: Path, dest: Path | None = None, threads: int = 0) -> tuple[Path, list[Verdict]]:
    """Install ``archive`` as the default bundle of its profile (or into ``dest``); returns the folder
    and the encoder verdicts measured here. Raises BundleError naming the failing step."""
    archive = Path(archive).expanduser()
    if not archive.is_file():
        raise BundleError(f"install: no archive at {archive}")
    # Beside its destination: renamed into place, so on its file system (a --dir on a USB disk too)
    folder = Path(dest).expanduser().parent if dest else M.home() / "bundles"
    staging = folder / f".install-{uuid.uuid4().hex[:8]}"
    try:
        if dest is not None:
            _check_dest(Path(dest).expanduser())  # before the minutes a Pi takes to unpack and verify
        with _one_install(folder):
            return _install(archive, staging, dest, threads)
    except OSError as exc:  # a --dir under a file or in a read-only folder: was a traceback
        raise BundleError(f"install: cannot install into {dest or folder}: {exc}") from exc


def _install(archive: Path, staging: Path, dest: Path | None, threads: int) -> tuple[Path, list[Verdict]]:
    try:
        _unpack(archive, staging)
        bundle = B.Bundle.load(staging)  # a fresh folder has no hash stamps: every file is hashed
        check_models(bundle)
        verdicts = verify_bundle(bundle, threads)
        if verdicts and not any(v.passed for v in verdicts):
            raise BundleError("install: step 'verify' failed on this CPU: " + "; ".join(v.summary() for v in verdicts))
        dest = Path(dest or M.default_bundle(bundle.manifest.get(B.KEY_PROFILE, "custom"))).expanduser()
        _replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest, verdicts


@contextlib.contextmanager
def _one_install(folder: Path) -> Iterator[None]:
    """One install at a time into ``folder`` (a BundleError for a second); with it held, what a killed install left
    there goes: its staging folder, the old bundle it had not removed yet (each up to a bundle's size, for good)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".install.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BundleError(f"install: another install into {folder} is running; try again when it is done") from None
        for left in folder.iterdir():  # an old bundle alone is kept: it may be the only whole one
            named = LEFT_BEHIND.fullmatch(left.name)
            if named and _bundle_files_only(left) and (named[1] is None or (folder / named[1]).is_dir()):
                shutil.rmtree(left, ignore_errors=True)
        yield
    finally:
        os.close(fd)  # the lock goes with it


def _unpack(archive: Path, staging: Path) -> None:
    try:
        with tarfile.open(archive, tarinfo=_Entry) as tar:
            members = _members(tar, archive, shutil.disk_usage(staging.parent).free)
            staging.mkdir()
            for member in members:  # written here, not by extractall: no mode, owner or time from the archive
                with tar.extractfile(member) as src, open(staging / member.name, "xb") as out:  # type: ignore[union-attr]
                    shutil.copyfileobj(src, out, 1 << 20)
                    os.fsync(out.fileno())  # on the card before the old bundle is removed
            fsync_dir(staging)
    except (tarfile.TarError, OSError) as exc:
        tried = str(exc).splitlines()  # tarfile.open's: a line per compression it tried, as plain tar the last
        why = f"not a tar archive, plain or compressed ({tried[-1].removeprefix('- method ')})" if len(tried) > 1 \
            else str(exc)
        raise BundleError(f"install: step 'unpack' failed for {archive}: {why}") from exc


class _Entry(tarfile.TarInfo):
    """An archive entry whose header tarfile may read: a long name or pax records up to MAX_EXTENDED_BYTES (tarfile
    reads one whole into memory: a 2 MB .tar.gz of a 512 MB name peaked at 1.1 GB RSS), no sparse map (read whole
    too, and no bundle file is sparse)."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        sparse = self.type == tarfile.GNUTYPE_SPARSE
        if sparse or self.type in EXTENDED and self.size > MAX_EXTENDED_BYTES:
            what = "a sparse entry" if sparse else f"an extended header of {self.size} bytes"
            raise BundleError(f"install: {str(tar.name)} is not a bundle archive ({what} at byte {self.offset})")
        return super()._proc_member(tar)  # type: ignore[misc]

    def _proc_gnusparse_10(self, *_: object) -> None:  # a pax sparse map, read from the entry's data
        raise BundleError(f"install: {self.name[:80]!r} is a sparse entry, not a bundle file")


def _members(tar: tarfile.TarFile, archive: Path, free: int) -> list[tarfile.TarInfo]:
    """The archive's entries, each a plain file under one of a bundle's file names, once, all fitting in ``free``
    bytes. Read one at a time and refused at the first that is not: an archive of 200,000 empty files was listed
    whole (25 s, +92 MB) and unpacked, a file of any other name was installed, a name given twice was the last; the
    size is checked at each header, before its data is skipped (a compressed archive decompresses it to skip it)."""
    members: dict[str, tarfile.TarInfo] = {}
    for member in tar:
        if not member.isfile() or member.name not in BUNDLE_NAMES - {B.VERIFIED} or member.name in members:
            raise BundleError(f"install: {archive} is not a bundle archive (unexpected entry {member.name[:80]!r}"
                              f"{', given twice' if member.name in members else ''})")
        members[member.name] = member
        need = sum(m.size for m in members.values())
        if need + KEEP_FREE_BYTES > free:  # refused first: a disk filled to the last byte fails every store's commit
            raise BundleError(f"install: {archive} unpacks to over {need / 1e6:.0f} MB and its destination's disk has "
                              f"{free / 1e6:.0f} MB free (an install leaves {KEEP_FREE_BYTES >> 20} MB for the stores "
                              "and logs there): free some space or install it elsewhere (--dir)")
    return list(members.values())


def _replace(staging: Path, dest: Path) -> None:
    """Rename ``staging`` to ``dest``; an existing ``dest`` is swapped with it, or moved aside first and removed after."""
    _check_dest(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_dir() and not dest.is_symlink() and _exchange(staging, dest):
        fsync_dir(dest.parent)
        return  # ``staging`` holds the old bundle now: removed with it
    old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
    if dest.exists():
        dest.rename(old)
    staging.rename(dest)
    fsync_dir(dest.parent)
    shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one step (Linux: renameat2 RENAME_EXCHANGE), so no instant finds ``b`` without a bundle:
    with two renames, a kill between them (strace-injected) left none, the old one hidden as '.NAME.old-*'. False
    where libc, the kernel or the file system cannot (the two renames then)."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    return renameat2 is not None and renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0


def _check_dest(dest: Path) -> None:
    """Refuse a ``dest`` that holds anything a bundle does not (its names; a damaged bundle is fine, as are atomic
    writes' hidden temp files): replacing it deletes it, and ``--dir ~/docs`` once deleted every file in ~/docs."""
    if dest.is_symlink() or not dest.is_dir():  # absent; a link or a file is moved aside, not deleted
        return
    if not _bundle_files_only(dest):
        raise BundleError(f"install: {dest} is not a model bundle folder (it holds files a bundle does not); "
                          "installing there would delete them: choose another --dir")


def _bundle_files_only(folder: Path) -> bool:
    """Whether ``folder`` is a folder (not a link) of nothing but a bundle's names and atomic writes' temp files."""
    return (folder.is_dir() and not folder.is_symlink()
            and all(p.name in BUNDLE_NAMES or p.name.startswith(".") and p.name.endswith(".tmp") for p in folder.iterdir()))


def can_build() -> bool:
    """Whether this environment can build bundles: the convert package and torch importable."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers", "convert"))


def pull(profile: str, dest: Path | None, precision: str | None, force: bool) -> Path:
    """Build (or reuse) the bundle of ``profile`` here; needs torch, else says what to do instead."""
    dest = Path(dest or M.default_bundle(profile)).expanduser()
    if not can_build():
        raise BundleError("models pull: this environment has no torch/convert extra, so it cannot build a bundle; "
                          + HOST_STEPS.format(profile=profile))
    cmd = [sys.executable, "-m", "convert", "bundle", "--profile", profile, "--dir", str(dest),
           *(["--precision", precision] if precision else []), *(["--force"] if force else [])]
    result = subprocess.run(cmd)
    if result.returncode != 0:
        raise BundleError(f"models pull: `{' '.join(cmd[1:])}` exited {result.returncode}; "
                          "its last lines above name the failing step")
    return dest
