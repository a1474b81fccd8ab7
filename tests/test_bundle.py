import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge_rag.errors import BundleError
from edge_rag.models import bundle as B

ROOT = Path(__file__).resolve().parent.parent


# Large files no test here writes, renames or removes: linked into each copy, not copied (the fp32 encoder and the
# reader were 113 of the 136 MB each of ~35 copies wrote). A load reads them through the link, sha256 and all.
LINKED = (B.ROLE_GENERATOR, B.ROLE_ENCODER_FP32, B.ROLE_READER)


@pytest.fixture
def bundle_copy(bundle_dir, tmp_path):
    """A copy of the real bundle; the large files only read (``LINKED``) are linked, the files we damage are copied."""
    for entry in json.loads((bundle_dir / B.MANIFEST).read_text())["files"] + [{"name": B.MANIFEST}]:
        src, dst = bundle_dir / entry["name"], tmp_path / entry["name"]
        if entry.get("role") in LINKED:
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


def test_a_roles_sha256_is_its_files_and_a_missing_role_is_named(bundle):
    from edge_rag.storage.fileio import sha256_file

    assert bundle.sha256(B.ROLE_ROUTER) == sha256_file(bundle.require(B.ROLE_ROUTER))
    with pytest.raises(BundleError, match="no no-such-role file"):
        bundle.sha256("no-such-role")


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


def test_a_bundle_of_another_encoder_precision_is_rebuilt(bundle_copy, capsys):
    """`models verify`'s advice where int8 fails on a CPU is 'rebuild with --precision fp32'; `convert bundle
    --precision fp32` over the int8 bundle said 'complete and verified' and kept it as it was. No --precision keeps
    the bundle's own (`make models` does not undo an fp32 rebuild)."""
    from convert.bundle import _current

    assert _current(bundle_copy, "int8") and _current(bundle_copy)
    assert not _current(bundle_copy, "fp32") and "the bundle's encoder is int8, --precision fp32 asked" in capsys.readouterr().out


def _edit_manifest(root, edit) -> None:
    path = root / B.MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def _file(manifest: dict, role: str) -> dict:
    return next(f for f in manifest["files"] if f["role"] == role)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("encoder"), "the 'encoder' section is missing"),
    (lambda m: m.pop("generator"), "the 'generator' section is missing"),
    (lambda m: m.update(encoder="minilm"), "the 'encoder' section is not an object"),
    (lambda m: m.update(generator=[]), "the 'generator' section is not an object"),
    (lambda m: m["encoder"].pop("dim"), r"'encoder.dim' must be a positive integer, not null"),
    (lambda m: m["encoder"].update(dim="384"), r"'encoder.dim' must be a positive integer"),
    (lambda m: m["encoder"].update(max_seq_len=-1), r"'encoder.max_seq_len' must be a positive integer"),
    (lambda m: m["encoder"].update(max_seq_len=True), r"'encoder.max_seq_len' must be a positive integer"),
    (lambda m: m["encoder"].update(precision="int4"), "encoder precision must be one of fp32, int8"),
    (lambda m: m["generator"].update(prompt_style=7), r"'generator.prompt_style' must be a string"),
    (lambda m: m["generator"].update(prompt_style="any"), "prompt_style must be one of"),
    (lambda m: m["generator"].update(stop="<|im_end|>"), "generator stop must be a list of non-empty strings"),
    (lambda m: m["generator"].update(stop=["<|im_end|>", ""]), "generator stop must be a list of non-empty strings"),
    (lambda m: m.update(router="yes"), "'router' must be an object"),
    (lambda m: m.update(profile="../../elsewhere"), "profile '../../elsewhere' is not a name"),
    (lambda m: m.update(profile=["gemma"]), "is not a name"),
])
def test_every_manifest_corruption_is_one_bundle_error(bundle_copy, edit, message):
    """Issue #43: a manifest without its encoder or generator section crashed every load with a traceback."""
    _edit_manifest(bundle_copy, edit)
    with pytest.raises(BundleError, match=message):
        B.Bundle.load(bundle_copy)


@pytest.mark.parametrize("name", [
    lambda outside: str(outside),  # absolute
    lambda outside: f"../{outside.parent.name}/{outside.name}",  # climbs out
    lambda outside: f"{outside.name}/../{outside.name}",
    lambda outside: "sub/tokenizer.json",  # a folder inside is not a bundle file name either
])
def test_a_file_name_outside_the_bundle_is_refused_before_it_is_read(bundle_copy, tmp_path_factory, name):
    """Issue #43: a manifest naming ``/abs/path`` or ``../x`` loaded that file (a matching size and sha256 were all it
    took); a file name is one plain path component now, checked before any file is opened."""
    outside = tmp_path_factory.mktemp("outside") / "tokenizer.json"
    (bundle_copy / "tokenizer.json").rename(outside)
    (bundle_copy / "sub").mkdir()
    (bundle_copy / "sub" / "tokenizer.json").symlink_to(outside)
    bad = name(outside)
    _edit_manifest(bundle_copy, lambda m: _file(m, B.ROLE_TOKENIZER).update(name=bad))
    atime = outside.stat().st_atime_ns
    with pytest.raises(BundleError, match=r"not a file inside the bundle folder"):
        B.Bundle.load(bundle_copy)
    assert outside.stat().st_atime_ns == atime  # never opened (the stamp file lists none of it either)
    assert not (bundle_copy / B.VERIFIED).exists()


@pytest.mark.parametrize("stamps", [
    [],
    {"version": 3, "full_at": 0, "files": []},
    {"version": 3, "full_at": "yesterday", "files": {}},
    {"version": 3, "full_at": 1e300, "files": {"encoder.onnx": "ok"}},
    {"version": 3, "files": {"encoder.onnx": {"key": 1, "blocks": [1]}}},
    "REPLACE",  # every file's real stamp with its blocks emptied: a check of nothing would pass
])
def test_a_stamp_file_of_the_wrong_shape_is_rebuilt_by_hashing(bundle_copy, stamps):
    """Issue #43: a ``.verified.json`` of the wrong shape crashed every load; it is a cache of the last full check,
    so one that does not hold stamps is ignored: every file is hashed in full and the stamps are written again."""
    B.Bundle.load(bundle_copy)
    path = bundle_copy / B.VERIFIED
    good = json.loads(path.read_text())
    if stamps == "REPLACE":
        stamps = {**good, "files": {n: {**s, "blocks": []} for n, s in good["files"].items()}}
    path.write_text(json.dumps(stamps))
    checked = B.Bundle.load(bundle_copy, verify=False).verify_files()
    assert set(checked.values()) == {"sha256"}
    assert json.loads(path.read_text())["files"].keys() == good["files"].keys()
    assert set(B.Bundle.load(bundle_copy, verify=False).verify_files().values()) != {"sha256"}  # stamps again


def test_a_last_full_pass_stamped_ahead_by_a_wrong_clock_is_due_at_once(bundle_copy):
    """A Pi has no real-time clock: a bad NTP fix a year ahead, corrected back, left ``full_at`` a year in the future,
    and no full sha256 pass ran for 364 days where one is promised every FULL_VERIFY_INTERVAL_S (7 days). A last pass
    in the future is due now; once stamped at the right time, the block check does again."""
    B.Bundle.load(bundle_copy)
    path = bundle_copy / B.VERIFIED
    stamps = json.loads(path.read_text())
    path.write_text(json.dumps({**stamps, "full_at": stamps["full_at"] + 365 * 24 * 3600}))
    assert set(B.Bundle.load(bundle_copy, verify=False).verify_files().values()) == {"sha256"}
    assert json.loads(path.read_text())["full_at"] <= stamps["full_at"] + B.FULL_VERIFY_INTERVAL_S
    assert set(B.Bundle.load(bundle_copy, verify=False).verify_files().values()) != {"sha256"}


def test_cli_says_what_is_wrong_in_one_line_and_exits_2(bundle_copy):
    """The command line on a damaged manifest: ``edge-rag: error: ...`` on one line, exit 2, no traceback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    pristine = (bundle_copy / B.MANIFEST).read_text()
    for edit in (lambda m: m.pop("encoder"), lambda m: _file(m, B.ROLE_TOKENIZER).update(name="/etc/passwd"),
                 lambda m: m.update(files="all")):
        (bundle_copy / B.MANIFEST).write_text(pristine)
        _edit_manifest(bundle_copy, edit)
        r = subprocess.run([sys.executable, "-m", "edge_rag", "models", "verify", "--bundle", str(bundle_copy)],
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.startswith("edge-rag: error: "), r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_verify_opens_each_model_as_its_role_says(bundle_copy, tmp_path_factory):
    """`models verify` checked hashes and the encoder only: a bundle whose generator.gguf is not a GGUF (its manifest
    hashing it) printed PASS and exited 0, while every `index` and `ask` failed on its header. It opens each model as
    its role says now: one line naming the file, exit 2."""
    import hashlib

    junk = bytes(range(256)) * 4096
    (bundle_copy / "generator.gguf").unlink()  # a link to the real GGUF: replaced, not written through
    (bundle_copy / "generator.gguf").write_bytes(junk)
    _edit_manifest(bundle_copy, lambda m: _file(m, B.ROLE_GENERATOR).update(size=len(junk),
                                                                             sha256=hashlib.sha256(junk).hexdigest()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "EDGE_RAG_HOME": str(tmp_path_factory.mktemp("home"))}
    r = subprocess.run([sys.executable, "-m", "edge_rag", "models", "verify", "--bundle", str(bundle_copy)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "generator.gguf: not a GGUF file" in r.stderr, (r.returncode, r.stdout, r.stderr)
