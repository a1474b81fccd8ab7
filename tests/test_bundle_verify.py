"""Checked bundle files: an edit that keeps the mtime is caught (ctime/inode in the stamp), bit rot that
changes no metadata is caught by the sampled block hashes, and a full pass is there on request."""
import json
import os
import shutil

import pytest

from edge_rag import bundle as B
from edge_rag.errors import BundleError


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
    """A copy of ``base`` with its stamps (the linked GGUF keeps its identity, so it is only sampled)."""
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


def test_bit_rot_without_metadata_change_is_caught_by_sampled_blocks(copy):
    bundle = B.Bundle.load(copy)
    checked = bundle.verify_files()
    assert checked["tokenizer.json"] == "1 of 1 blocks"  # small files are checked whole at every load
    tokenizer = bundle.require(B.ROLE_TOKENIZER)
    _flip(tokenizer, 1000, 16)
    stamps = json.loads((copy / B.VERIFIED).read_text())  # as if the disk changed the bytes by itself:
    st = tokenizer.stat()  # the recorded identity still matches the file
    stamps["files"]["tokenizer.json"]["key"][:4] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    (copy / B.VERIFIED).write_text(json.dumps(stamps))
    with pytest.raises(BundleError, match="tokenizer.json: block 0 changed"):
        B.Bundle.load(copy)
    with pytest.raises(BundleError, match="fails its sha256 check"):
        bundle.verify_files(full=True)


def test_large_files_are_sampled_not_rehashed(copy):
    checked = B.Bundle.load(copy).verify_files()
    blocks = -(-(copy / "generator.gguf").stat().st_size // B.BLOCK_BYTES)
    assert checked["generator.gguf"] == f"{B.SAMPLED_BLOCKS} of {blocks} blocks"
