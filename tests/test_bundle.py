import json
import shutil

import pytest

from edge_rag import bundle as B
from edge_rag.errors import BundleError


@pytest.fixture
def bundle_copy(bundle_dir, tmp_path):
    """A copy of the real bundle; the large GGUF is linked, the files we damage are copied."""
    for entry in json.loads((bundle_dir / B.MANIFEST).read_text())["files"] + [{"name": B.MANIFEST}]:
        src, dst = bundle_dir / entry["name"], tmp_path / entry["name"]
        if entry.get("role") == B.ROLE_GENERATOR:
            dst.symlink_to(src)
        else:
            shutil.copyfile(src, dst)
    return tmp_path


def test_manifest_describes_the_bundle(bundle):
    m = bundle.manifest
    assert {f["role"] for f in m["files"]} >= set(B.REQUIRED_ROLES)
    assert all(len(f["sha256"]) == 64 and f["size"] > 0 for f in m["files"])
    assert m["encoder"]["dim"] == 384 and m["encoder"]["pooling"] == "mean" and m["encoder"]["max_seq_len"] == 256
    assert m["encoder"]["parity"]["passed"] and m["generator"]["license"]


def test_copy_verifies(bundle_copy):
    assert B.Bundle.load(bundle_copy).require(B.ROLE_ENCODER).name == "encoder.onnx"


def test_missing_manifest(tmp_path):
    with pytest.raises(BundleError, match="edge-rag models pull"):
        B.Bundle.load(tmp_path)


def test_truncated_file_is_named(bundle_copy):
    path = bundle_copy / "encoder.onnx"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(BundleError, match=r"encoder\.onnx is 1000 bytes.*truncated"):
        B.Bundle.load(bundle_copy)


def test_corrupt_file_is_named(bundle_copy):
    B.Bundle.load(bundle_copy)  # records a verified stamp; a later change must still be caught
    path = bundle_copy / "tokenizer.json"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"tokenizer\.json fails its sha256"):
        B.Bundle.load(bundle_copy)


def test_missing_file_is_named(bundle_copy):
    (bundle_copy / "tokenizer.json").unlink()
    with pytest.raises(BundleError, match=r"missing: .*tokenizer\.json"):
        B.Bundle.load(bundle_copy)


def test_broken_manifest(bundle_copy):
    (bundle_copy / B.MANIFEST).write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        B.Bundle.load(bundle_copy)


@pytest.mark.parametrize("edit, message", [
    (lambda m: [m], "holds a list where a JSON object is expected"),
    (lambda m: {**m, "files": [{k: v for k, v in f.items() if k != "role"} for f in m["files"]]},
     "file entry 0 lacks a valid role"),
    (lambda m: {**m, "files": {"encoder.onnx": "encoder"}}, "'files' must be a list"),
    (lambda m: {**m, "files": m["files"][:1] + ["encoder.onnx"]}, "file entry 1 lacks a valid name, role, size"),
    (lambda m: {**m, "files": [{**f, "size": str(f["size"])} for f in m["files"]]}, "file entry 0 lacks a valid size"),
])
def test_malformed_manifest_is_a_bundle_error(bundle_copy, edit, message):
    """Issue #26: a file entry without a role, or a manifest that is a list, gave a Python traceback."""
    manifest = json.loads((bundle_copy / B.MANIFEST).read_text())
    (bundle_copy / B.MANIFEST).write_text(json.dumps(edit(manifest)))
    with pytest.raises(BundleError, match=message):
        B.Bundle.load(bundle_copy)


def test_an_older_format_version_is_rebuilt(bundle_copy, capsys):
    """`make models` / `models pull` rebuild a bundle whose manifest predates this format version."""
    from convert.bundle import _current

    assert _current(bundle_copy)
    manifest = json.loads((bundle_copy / B.MANIFEST).read_text())
    (bundle_copy / B.MANIFEST).write_text(json.dumps({**manifest, "format_version": B.FORMAT_VERSION - 1}))
    with pytest.raises(BundleError, match=rf"v{B.FORMAT_VERSION - 1}, this edge-rag reads edge-rag-bundle v"):
        B.Bundle.load(bundle_copy)
    assert not _current(bundle_copy) and "rebuilding" in capsys.readouterr().out
