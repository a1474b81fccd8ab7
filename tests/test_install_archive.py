"""``edge-rag models install`` on an archive from a USB stick or a download: untrusted input, installed into the
folder the user names. Whatever the archive or the folder holds, nothing outside the bundle is lost."""
from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from edge_rag.errors import BundleError
from edge_rag.models import bundle as B
from edge_rag.models.install import install


@pytest.fixture(scope="module")
def archive(bundle_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from convert.bundle import archive

    return archive(bundle_dir, tmp_path_factory.mktemp("archive") / "edge-rag-gemma.tar")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGE_RAG_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def refused_in_little_memory(archive: Path) -> str:
    """Why ``install(archive)`` refused it, having traced less than 1 MB of Python memory on the way."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(BundleError) as refused:
            install(archive)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak / 2**20:.1f} MB traced"
    return str(refused.value)


def test_a_folder_that_is_not_a_bundle_is_never_replaced(archive: Path, home: Path, tmp_path: Path) -> None:
    """`models install ARCHIVE --dir ~/docs` deleted every file in ~/docs (it moved the folder aside as the old bundle
    and removed it). A folder holding anything a bundle does not is refused, and keeps what it holds."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "notes.txt").write_text("mine")
    (docs / "manifest.json").write_text("{}")  # a web app's: a manifest alone does not make a bundle folder
    with pytest.raises(BundleError, match="is not a model bundle folder"):
        install(archive, docs)
    assert sorted(p.name for p in docs.iterdir()) == ["manifest.json", "notes.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".docs")]
    damaged = tmp_path / "bundle"  # a bundle folder, however damaged, is what an install replaces
    damaged.mkdir()
    for name in ("manifest.json", "encoder.onnx", ".verified.json", "..verified.json.7.0a1b2c3d.tmp"):
        (damaged / name).write_text("{not json")
    assert install(archive, damaged)[0] == damaged and (damaged / "generator.gguf").is_file()


def test_a_bundle_folder_on_another_file_system_is_installed(archive: Path, home: Path) -> None:
    """The archive was unpacked under $EDGE_RAG_HOME and renamed to --dir: a --dir on another file system (models on
    a USB disk, the home on the SD card) failed every time with a traceback (EXDEV), after moving the bundle there
    aside as '.gemma.old-*', so that folder no longer held a bundle. It is unpacked beside its destination now."""
    import tempfile

    other = Path(tempfile.mkdtemp(dir="/dev/shm")) if Path("/dev/shm").is_dir() else None
    if other is None or other.stat().st_dev == archive.stat().st_dev:
        pytest.skip("needs /dev/shm on another file system than the temporary folder")
    try:
        dest = other / "gemma"
        dest.mkdir()
        (dest / B.MANIFEST).write_text("{}")  # a bundle folder there already
        assert install(archive, dest)[0] == dest and B.Bundle.load(dest).root == dest
        assert sorted(p.name for p in other.iterdir()) == [".install.lock", "gemma"]
    finally:
        shutil.rmtree(other)


@pytest.mark.parametrize("name, data", [("notes.txt", b"not a model"), ("tokenizer.json", b"{}")])
def test_an_archive_entry_that_is_not_a_bundle_file_is_refused(archive: Path, home: Path, tmp_path: Path,
                                                               name: str, data: bytes) -> None:
    """A file of another name was installed into the bundle folder with the rest (any size), and a name given twice
    was unpacked twice, the last copy kept. Both are refused before anything is unpacked."""
    import io
    import tarfile

    bad = Path(shutil.copyfile(archive, tmp_path / "bad.tar"))
    with tarfile.open(bad, "a") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(BundleError, match=rf"not a bundle archive \(unexpected entry '{name}'"):
        install(bad)
    assert {p.name for p in (home / "bundles").iterdir()} <= {".install.lock"}  # nothing unpacked stays


@pytest.mark.parametrize("content", [b"", b"junk\n", b"\x1f\x8b" + bytes(200)])
def test_a_file_that_is_no_tar_archive_is_one_line(home: Path, tmp_path: Path, content: bytes) -> None:
    """An empty or foreign file given to `edge-rag models install` ended on five lines, tarfile's 'file could not be
    opened successfully:' and one line per compression it tried; docs/reference/cli.md promises one line naming the
    file. It says, on one line, that the file is no tar archive."""
    bad = tmp_path / "edge-rag-gemma.tar"
    bad.write_bytes(content)
    with pytest.raises(BundleError) as refused:
        install(bad)
    message = str(refused.value)
    assert "\n" not in message and f"failed for {bad}: not a tar archive, plain or compressed (tar: " in message, message


def test_an_archive_of_many_entries_is_refused_at_the_first_foreign_one(home: Path, tmp_path: Path) -> None:
    """Every entry of the archive was listed before the first was looked at, then all were unpacked: 200,000 empty
    files took 25 s and +92 MB of RSS, and made 200,000 files, before 'manifest.json missing'. The first entry that
    is not a bundle file ends the install: it reads no more of the archive."""
    import tarfile

    many = tmp_path / "many.tar"
    with tarfile.open(many, "w") as tar:
        for n in range(20_000):
            tar.addfile(tarfile.TarInfo(f"x{n:07d}"))
    assert "unexpected entry 'x0000000'" in refused_in_little_memory(many)


def test_an_archive_larger_than_the_free_space_is_refused_before_it_is_unpacked(home: Path, tmp_path: Path) -> None:
    """An archive was unpacked until the disk was full (a 390 MB archive into 315 MB free: the disk at 0 bytes free
    until the install failed, every store's and log's commit on it failing meanwhile). Its entries' sizes are added
    up first and checked against the free space: this one's data is cut short, so it is refused unread."""
    import tarfile

    info = tarfile.TarInfo("generator.gguf")
    info.size = shutil.disk_usage(tmp_path).free + (1 << 30)
    bomb = tmp_path / "bomb.tar"
    bomb.write_bytes(info.tobuf(tarfile.GNU_FORMAT) + bytes(1 << 20))
    with pytest.raises(BundleError, match=r"unpacks to over \d+ MB and its destination's disk has \d+ MB free"):
        install(bomb)
    assert {p.name for p in (home / "bundles").iterdir()} <= {".install.lock"}  # nothing unpacked stays


def test_installed_files_are_this_users_and_on_disk_before_the_old_bundle_goes(archive: Path, home: Path,
                                                                              tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """tarfile gave each file the archive's mode and owner: an archive's 0o6777 entries, installed with sudo, were
    set-uid, world-writable model files owned by uid 4242 (any user could rewrite the GGUF a server has mapped).
    And no model file was fsynced before the old bundle was removed (only the stamps were): a power cut in the next
    seconds left no whole bundle. Files are written by the install now, with this user's umask, and fsynced."""
    import os
    import tarfile

    odd = tmp_path / "odd.tar"
    with tarfile.open(archive) as src, tarfile.open(odd, "w") as out:
        for member in src:
            member.mode, member.uid, member.gid, member.uname, member.gname = 0o6777, 4242, 4242, "", ""
            out.addfile(member, src.extractfile(member))
    synced: list[str] = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or fsync(fd))
    dest, _ = install(odd)
    names = [f["name"] for f in B.Bundle.load(dest).files()] + [B.MANIFEST]
    for name in names:
        st = (dest / name).stat()
        assert st.st_mode & 0o7022 == 0 and st.st_uid == os.geteuid(), (name, oct(st.st_mode), st.st_uid)
    assert {Path(p).name for p in synced} >= set(names)


def test_what_a_killed_install_left_is_removed_and_installs_take_turns(archive: Path, home: Path) -> None:
    """An install killed while unpacking (power cut, kill -9) left its staging folder for good: three killed 1.2 s in
    left 360 MB in '.install-*' folders that no later install removed. The next install removes them (and an old
    bundle a killed install had not removed yet, when its bundle is there); a second install at the same time is
    refused, as it would take the first's staging folder for a leftover."""
    import fcntl
    import os

    bundles = home / "bundles"
    for left in (".install-0badf00d", ".gemma.old-0badf00d", ".tiny.old-0badf00d", ".photos.old-1a2b3c4d"):
        (bundles / left).mkdir(parents=True)
        (bundles / left / "generator.gguf").write_bytes(b"GGUF" * 1000)
    (bundles / ".photos.old-1a2b3c4d" / "me.jpg").write_bytes(b"JPEG")  # not a bundle's: kept
    (bundles / "gemma").mkdir()
    (bundles / "photos").mkdir()
    fd = os.open(bundles / ".install.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as another install holds it
        with pytest.raises(BundleError, match="another install into .* is running"):
            install(archive)
    finally:
        os.close(fd)
    assert install(archive)[0] == bundles / "gemma"
    assert sorted(p.name for p in bundles.iterdir()) == [".install.lock", ".photos.old-1a2b3c4d", ".tiny.old-0badf00d",
                                                         "gemma", "photos"]


def test_a_compressed_archive_is_refused_at_the_header_of_an_entry_that_does_not_fit(home: Path, tmp_path: Path) -> None:
    """tarfile reads a gzip, bzip2 or xz archive too, and listing its entries decompresses each one's data to skip
    it: a 2 MB .tar.gz of a 2 GB generator.gguf took 3.9 s to be refused for want of space (a 200 MB one: minutes
    here, far more on a Pi). The size is checked at each entry's header, before its data is read: this archive's
    data is cut short, so reading it fails, and it is refused for its size without being read."""
    import gzip
    import tarfile

    info = tarfile.TarInfo("generator.gguf")
    info.size = shutil.disk_usage(tmp_path).free + (1 << 30)
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(gzip.compress(info.tobuf(tarfile.GNU_FORMAT) + bytes(1 << 20)))
    with pytest.raises(BundleError, match=r"unpacks to over \d+ MB and its destination's disk has \d+ MB free"):
        install(bomb)


def test_an_entry_header_that_tarfile_would_read_whole_is_refused(home: Path, tmp_path: Path) -> None:
    """tarfile reads a long name (GNU) or pax records whole into memory before anyone sees the entry: a 2 MB .tar.gz
    of a 512 MB name peaked at 1.1 GB RSS (enough to have a 4 GB Pi's kiosk killed); a sparse map likewise. An
    extended header over 64 KB, or a sparse entry, is refused at its header."""
    import subprocess
    import tarfile
    import zlib

    long = tarfile.TarInfo("././@LongLink")
    long.type, long.size = tarfile.GNUTYPE_LONGNAME, 16 << 20
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    bomb = tmp_path / "long.tar.gz"
    bomb.write_bytes(packer.compress(long.tobuf(tarfile.USTAR_FORMAT) + b"a" * long.size)
                     + packer.compress(tarfile.TarInfo("x").tobuf(tarfile.USTAR_FORMAT) + bytes(1024)) + packer.flush())
    assert "an extended header of 16777216 bytes at byte 0" in refused_in_little_memory(bomb)
    if shutil.which("tar"):
        src = tmp_path / "src"
        src.mkdir()
        with open(src / "generator.gguf", "wb") as f:
            f.truncate(1 << 30)  # all hole
        subprocess.run(["tar", "--sparse", "-cf", tmp_path / "sparse.tar", "-C", src, "generator.gguf"], check=True)
        with pytest.raises(BundleError, match=r"not a bundle archive \(a sparse entry at byte 0\)"):
            install(tmp_path / "sparse.tar")


def _repack(archive: Path, out: Path, edit: Callable[[dict], object], files: dict[str, bytes] | None = None) -> Path:
    """``archive`` with its manifest edited and the named files' data replaced (the manifest hashing them)."""
    import hashlib
    import io
    import json
    import tarfile

    files = files or {}
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        for member in src:
            if member.name not in files and member.name != B.MANIFEST:
                dst.addfile(member, src.extractfile(member))
                continue
            data = files.get(member.name) or src.extractfile(member).read()
            if member.name == B.MANIFEST:
                manifest = json.loads(data)
                for entry in manifest["files"]:
                    if entry["name"] in files:
                        entry.update(size=len(files[entry["name"]]), sha256=hashlib.sha256(files[entry["name"]]).hexdigest())
                edit(manifest)
                data = json.dumps(manifest).encode()
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    return out


def test_an_archive_whose_generator_is_no_gguf_does_not_replace_the_bundle(archive: Path, home: Path,
                                                                          tmp_path: Path) -> None:
    """Every hash right and the encoder passing, an archive whose generator.gguf was not a GGUF (1 MB of random bytes
    under a manifest that hashed them) was installed over a working bundle: 'installed', exit 0, and then every
    `index` and `ask` failed on its GGUF header ('rebuild the bundle', on a device that cannot). Each model is opened
    as its role says before the swap (the GGUF's header, the router, the reader), and this one is refused."""
    bad = _repack(archive, tmp_path / "nogguf.tar", lambda m: None, {"generator.gguf": bytes(range(256)) * 4096})
    with pytest.raises(BundleError, match="not a GGUF file"):
        install(bad)
    assert not (home / "bundles" / "gemma").exists()


def test_an_archive_whose_manifest_gives_another_encoder_dim_is_refused(archive: Path, home: Path,
                                                                       tmp_path: Path) -> None:
    """The memory plan prices the index by the manifest's encoder.dim before the encoder is loaded: an archive saying
    96 for the 384-float MiniLM installed, and a 100,000-passage store was planned at 144 MB of index, not 292 (a
    bundle built from one's own 768-d encoder without its export report says 384 likewise). Refused at install."""
    bad = _repack(archive, tmp_path / "dim.tar", lambda m: m["encoder"].update(dim=96))
    with pytest.raises(BundleError, match=r"encoder.onnx makes 384-float vectors and the manifest's encoder.dim says 96"):
        install(bad)
    assert not (home / "bundles" / "gemma").exists()


def test_a_destination_that_cannot_be_written_is_one_error(archive: Path, home: Path, tmp_path: Path) -> None:
    """`models install ARCHIVE --dir notes.txt/gemma` (a typo: a file where a folder should be) ended in a traceback
    (FileExistsError from mkdir, exit 1); any OSError there is now a BundleError (CLI: one line, exit 2)."""
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(BundleError, match=r"cannot install into .*notes.txt/gemma: \[Errno 17\] File exists"):
        install(archive, tmp_path / "notes.txt" / "gemma")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_folder_always_holds_a_bundle_while_an_install_swaps_it(archive: Path, home: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The old bundle was renamed aside and the new one renamed in: a kill between the two (strace-injected at the
    second) or a Ctrl-C there left no bundle in the folder, the old one hidden as '.gemma.old-*' ('no model bundle at
    ...'). The two folders are swapped in one step where Linux can (renameat2 RENAME_EXCHANGE)."""
    dest = home / "bundles" / "gemma"
    dest.mkdir(parents=True)
    (dest / B.MANIFEST).write_text("{}")  # the bundle there
    renames = []
    rename = Path.rename

    def interrupted(self: Path, target: Path) -> Path:  # Ctrl-C once the old bundle is aside
        renames.append(self)
        if len(renames) == 2:
            raise KeyboardInterrupt
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", interrupted)
    with contextlib.suppress(KeyboardInterrupt):
        install(archive)
    assert dest.is_dir() and not renames, [p.name for p in dest.parent.iterdir()]
    assert B.Bundle.load(dest).root == dest
    assert sorted(p.name for p in dest.parent.iterdir()) == [".install.lock", "gemma"]


def test_an_archive_of_a_bundle_of_linked_files_holds_the_files(bundle_dir: Path, tmp_path: Path) -> None:
    """A bundle folder whose files are links (assemble copies no file already in place, and keeps a link) verified,
    and its archive held the links: 0 MB, each entry pointing at a host path, which the device refused ('not a
    bundle archive (unexpected entry ...)'). The archive holds the files the links point at."""
    import tarfile

    from convert.bundle import archive as pack

    linked = tmp_path / "linked"
    linked.mkdir()
    for f in B.Bundle.load(bundle_dir).files():
        (linked / f["name"]).symlink_to((bundle_dir / f["name"]).resolve())
    shutil.copyfile(bundle_dir / B.MANIFEST, linked / B.MANIFEST)
    with tarfile.open(pack(linked, tmp_path / "linked.tar")) as tar:
        sizes = {m.name: m.size for m in tar.getmembers() if m.isfile()}
    assert sizes == {f["name"]: f["size"] for f in B.Bundle.load(bundle_dir).files()} | {
        B.MANIFEST: (bundle_dir / B.MANIFEST).stat().st_size}
