"""Checked bundle files: an edit that keeps the mtime is caught (ctime/inode in the stamp), bit rot that
changes no metadata is caught by the per-block CRC32s wherever it is, and a full pass is there on request."""
import hashlib
import json
import os
import shutil

import pytest

from edge_rag.errors import BundleError
from edge_rag.models import bundle as B


@pytest.fixture(scope="module")
def base(bundle_dir, tmp_path_factory):
    """A private bundle, verified in full once: small files copied, the GGUF linked (never written to)."""
    root = tmp_path_factory.mktemp("bundle")
    for f in bundle_dir.iterdir():
        if f.name == B.VERIFIED:
            continue
        if f.suffix == ".gguf":
            (root / f.name).symlink_to(f)
        else:
            shutil.copy2(f, root / f.name)
    assert set(B.Bundle.load(root, verify=False).verify_files().values()) == {"sha256"}  # no stamps: all hashed
    return root


@pytest.fixture
def copy(base, tmp_path):
    """A copy of ``base`` with its stamps (the linked GGUF keeps its identity, so only its blocks are checked)."""
    return shutil.copytree(base, tmp_path / "bundle", symlinks=True)


def _flip(path, offset: int, n: int) -> None:
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the edit hides its mtime


def test_edit_with_mtime_kept_is_caught(copy):
    encoder = B.Bundle.load(copy).require(B.ROLE_ENCODER)
    _flip(encoder, encoder.stat().st_size // 2, 64 * 1024)
    with pytest.raises(BundleError, match="encoder.onnx fails its sha256 check"):
        B.Bundle.load(copy)


def _as_if_the_disk_did_it(copy, path) -> None:
    """Record the file's new identity in the stamps: bit rot changes no size, time or inode."""
    stamps = json.loads((copy / B.VERIFIED).read_text())
    st = path.stat()
    stamps["files"][path.name]["key"][:4] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    (copy / B.VERIFIED).write_text(json.dumps(stamps))


def test_bit_rot_without_metadata_change_is_caught_by_block_checks(copy):
    bundle = B.Bundle.load(copy)
    checked = bundle.verify_files()
    assert checked["tokenizer.json"] == "1 blocks (crc32)"
    tokenizer = bundle.require(B.ROLE_TOKENIZER)
    _flip(tokenizer, 1000, 16)
    _as_if_the_disk_did_it(copy, tokenizer)
    with pytest.raises(BundleError, match="tokenizer.json: block 0 changed"):
        B.Bundle.load(copy)
    with pytest.raises(BundleError, match="fails its sha256 check"):
        bundle.verify_files(full=True)


def test_a_flipped_bit_in_the_stamps_is_no_corrupt_bundle(copy):
    """The stamps are a cache on the same card: one bit of a block's CRC32 in .verified.json flipped made an intact
    bundle fail every load ('tokenizer.json: block 0 changed ... rebuild the bundle', 390 MB). The file is hashed in
    full against the manifest instead, passes, and its stamp is written again."""
    B.Bundle.load(copy).verify_files()
    stamps = json.loads((copy / B.VERIFIED).read_text())
    stamps["files"]["tokenizer.json"]["blocks"][0] ^= 1
    (copy / B.VERIFIED).write_text(json.dumps(stamps))
    assert B.Bundle.load(copy, verify=False).verify_files()["tokenizer.json"] == "sha256"
    assert B.Bundle.load(copy, verify=False).verify_files()["tokenizer.json"] == "1 blocks (crc32)"


def test_one_flipped_byte_anywhere_is_caught_at_every_load(copy):
    """Issue #26: with 4 sampled blocks per load, a flipped byte in a large file was caught in 0 of 20 loads.
    Now every block is checked: 20 flips at seeded offsets across the 23 MB encoder, 20 caught."""
    import random

    encoder = B.Bundle.load(copy).require(B.ROLE_ENCODER)
    rnd = random.Random(26)
    for _ in range(20):
        offset = rnd.randrange(encoder.stat().st_size)
        _flip(encoder, offset, 1)
        _as_if_the_disk_did_it(copy, encoder)
        with pytest.raises(BundleError, match="encoder.onnx: block .* changed"):
            B.Bundle.load(copy)
        _flip(encoder, offset, 1)  # back to the good byte
        _as_if_the_disk_did_it(copy, encoder)
    B.Bundle.load(copy)


def test_every_block_of_large_files_is_checked(copy):
    checked = B.Bundle.load(copy).verify_files()
    blocks = -(-(copy / "generator.gguf").stat().st_size // B.BLOCK_BYTES)
    assert checked["generator.gguf"] == f"{blocks} blocks (crc32)"


def test_a_load_soon_after_a_passing_one_reads_no_blocks_until_a_file_changes(copy, monkeypatch):
    """A process loading the bundle again within RECHECK_S of a load that passed, every file unchanged, checks no
    block (they would come from the page cache the last check filled); an edit that keeps the mtime is still caught
    at the next load, and once RECHECK_S has passed the blocks are read again."""
    monkeypatch.setattr(B, "SETTLED_NS", 0)  # the copy was made just now: remember its check all the same
    checks = []
    verify_files = B.Bundle.verify_files
    monkeypatch.setattr(B.Bundle, "verify_files", lambda self, full=False: checks.append(full) or verify_files(self, full))
    encoder = B.Bundle.load(copy).require(B.ROLE_ENCODER)
    B.Bundle.load(copy)
    assert checks == [False]  # the second load checked nothing
    _flip(encoder, 12345, 1)
    with pytest.raises(BundleError, match="encoder.onnx fails its sha256 check"):
        B.Bundle.load(copy)
    _flip(encoder, 12345, 1)  # the good byte back: hashed again, passes, remembered
    B.Bundle.load(copy)
    monkeypatch.setattr(B, "RECHECK_S", 0.0)
    B.Bundle.load(copy)
    assert checks == [False] * 4


def test_a_model_under_another_role_is_named_as_not_that_model(bundle) -> None:
    """A manifest that names one model for another's role (its hashes right) gave a raw ValueError from inside
    onnxruntime ("Required inputs (['features']) are missing") or from int('sequence'); the reader already said."""
    from edge_rag.reading.reader import Reader
    from edge_rag.retrieval.encode import Encoder
    from edge_rag.retrieval.route import Router

    tokenizer = bundle.require(B.ROLE_TOKENIZER)
    for role in (B.ROLE_READER, B.ROLE_ROUTER):
        with pytest.raises(BundleError, match="is not a sentence encoder"):
            Encoder(bundle.require(role), tokenizer)
    for role in (B.ROLE_READER, B.ROLE_ENCODER):
        with pytest.raises(BundleError, match="is not a tier router"):
            Router(bundle.require(role))
    with pytest.raises(BundleError, match="is not a reader model"):
        Reader(bundle.require(B.ROLE_ENCODER), tokenizer)


def test_a_model_loaded_on_first_use_is_the_file_its_manifest_names(copy) -> None:
    """The reader and llama.cpp are loaded on first use, maybe long after the bundle was verified: a kiosk running on
    while `models install` put a new bundle in its folder loaded the new GGUF under the manifest it held (sha256
    b5b13776ce70 loaded, a5fd3b62230a in its manifest), a model it had never checked. Such a file is hashed again
    against the manifest the process holds, and refused; the file verified at load is taken as it is."""
    from edge_rag.reading.read import reader_path

    bundle = B.Bundle.load(copy)
    reader = bundle.require(B.ROLE_READER)
    assert reader_path(bundle) == reader
    data = bytearray(reader.read_bytes())  # another bundle installed in its place: another reader, its manifest
    data[len(data) // 2] ^= 1
    (copy / "reader.new").write_bytes(data)
    (copy / "reader.new").replace(reader)
    manifest = json.loads((copy / B.MANIFEST).read_text())
    next(f for f in manifest["files"] if f["role"] == B.ROLE_READER)["sha256"] = hashlib.sha256(data).hexdigest()
    (copy / B.MANIFEST).write_text(json.dumps(manifest))
    assert B.Bundle.load(copy).verify_files()["reader.onnx"].endswith("(crc32)")  # the new bundle, stamped
    with pytest.raises(BundleError, match=r"reader.onnx fails its sha256 check.*changed since this process loaded"):
        reader_path(bundle)
