"""GGUF header (KV section + tensor infos) read with struct only, for the memory plan.

llama.cpp's vocab_only load costs +44 MB RSS and ~1 s for gemma's 262k vocab; this costs a few MB of
mmapped pages for ~0.3 s (skipping the vocabulary's strings), once per file version in a process: the plan
reads it at every EdgeRAG open. Layout and type codes as gguf-py's GGUFReader / GGML_QUANT_SIZES.
"""
from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BundleError

GGUF_MAGIC = b"GGUF"
GGML_MAX_DIMS = 4  # dimensions of a tensor (ggml.h)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_SMALL_ARRAY = 1024  # scalar arrays up to this length are kept (per-layer head counts); longer are skipped
# ggml tensor type → (elements per block, bytes per block), as gguf-py's GGML_QUANT_SIZES.
GGML_BLOCKS = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18),
}


@dataclass(frozen=True)
class GGUFInfo:
    """What the budget needs from a GGUF header (per-layer arrays reduced to their maximum)."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    key_length: int
    value_length: int
    n_ff: int
    context_length: int
    n_vocab: int
    file_bytes: int
    tensor_bytes: int
    metadata: dict = field(repr=False, default_factory=dict)  # scalars, strings, short tuples, GGUFArray


@dataclass(frozen=True)
class GGUFArray:
    """A long or string array in the header, skipped over: only its element type and length are kept."""

    type: int
    length: int


class _Cursor:
    """Little-endian reads from a buffer; any read past its end raises struct.error."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def read(self, fmt: str):
        values = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        n = self.read("Q")
        if self.pos + n > len(self.buf):
            raise struct.error("string runs past the end of the file")
        self.pos += n
        return self.buf[self.pos - n : self.pos].decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.read(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise ValueError(f"unknown value type {vtype}")
        etype, n = self.read("IQ")
        if etype in _SCALARS and n <= _SMALL_ARRAY:
            return self.read(_SCALARS[etype] * n) if n != 1 else (self.read(_SCALARS[etype]),)
        if etype in _SCALARS:
            self.pos += n * struct.calcsize(_SCALARS[etype])
        elif etype == _STRING:
            if self.pos + 8 * n > len(self.buf):
                raise struct.error("string array runs past the end of the file")
            length = struct.Struct("<Q").unpack_from
            for _ in range(n):
                self.pos += 8 + length(self.buf, self.pos)[0]
        else:
            raise ValueError(f"unsupported array element type {etype}")
        if self.pos > len(self.buf):
            raise struct.error("array runs past the end of the file")
        return GGUFArray(etype, n)


def read_gguf(path: str | Path) -> GGUFInfo:
    """Header of a GGUF file without loading weights; BundleError if it is not one, or truncated. Parsed once
    per file version (size, times, inode) in a process; a changed file is read again."""
    path = Path(path)
    try:
        stat = path.stat()
        return _read_gguf(path, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    except (OSError, ValueError, OverflowError, struct.error) as exc:
        raise BundleError(f"cannot read GGUF header of {path}: {exc}; rebuild the bundle") from exc


@functools.lru_cache(maxsize=8)  # an error is raised, never cached
def _read_gguf(path: Path, size: int, mtime_ns: int, ctime_ns: int, inode: int) -> GGUFInfo:
    """The header of ``path``; the file's size, times and inode key the cache."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf)
        if cur.read("4s") != GGUF_MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        version = cur.read("I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported")
        n_tensors, n_kv = cur.read("QQ")
        meta = {}
        for _ in range(n_kv):
            key = cur.string()
            meta[key] = cur.value(cur.read("I"))
        end = 0
        for _ in range(n_tensors):
            cur.string()
            n_dims = cur.read("I")
            if n_dims > GGML_MAX_DIMS:  # a format string of 4 billion Qs is gigabytes
                raise ValueError(f"a tensor with {n_dims} dimensions (GGML has at most {GGML_MAX_DIMS})")
            dims = cur.read("Q" * n_dims)
            dims = (dims,) if isinstance(dims, int) else dims
            ttype, offset = cur.read("IQ")
            count = 1
            for d in dims:
                count *= d
            block, nbytes = GGML_BLOCKS.get(ttype, (1, 0))  # unknown type: check its offset only
            end = max(end, offset + count // block * nbytes)
        align = meta.get("general.alignment", 32)
        if not _count(align) or align < 1:
            raise ValueError(f"general.alignment is {align!r:.40}, not a positive whole number")
        data_start = -(-cur.pos // align) * align
    if data_start + end > size:
        raise BundleError(
            f"GGUF {path} is truncated: its tensors need {data_start + end} bytes, the file has {size};"
            " rebuild the bundle"
        )
    return _gguf_info(path, meta, size, end)


def _count(value: object) -> bool:
    """Whether a metadata value is a whole number, 0 or more: a negative block count planned a model into any
    budget, an array in its place was a TypeError."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _gguf_info(path: Path, meta: dict, size: int, tensor_bytes: int) -> GGUFInfo:
    arch = meta.get("general.architecture")

    def get(key: str, default: int | None = None) -> int:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise BundleError(f"GGUF {path} has no {arch}.{key}; cannot budget its memory")
        values = value if isinstance(value, tuple) else (value,)  # a tuple: one per layer
        if not values or not all(_count(v) for v in values):
            raise BundleError(f"GGUF {path}: {arch}.{key} is {value!r:.60}, not a count; cannot budget its memory")
        return max(values)

    if not isinstance(arch, str):
        raise BundleError(f"GGUF {path} has no general.architecture")
    tokens = meta.get("tokenizer.ggml.tokens")
    n_vocab = tokens.length if isinstance(tokens, GGUFArray) else get("vocab_size")
    n_embd, n_head = get("embedding_length"), get("attention.head_count")
    key_length = get("attention.key_length", n_embd // max(n_head, 1))
    return GGUFInfo(
        arch=arch,
        n_layer=get("block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=get("attention.head_count_kv", n_head),
        key_length=key_length,
        value_length=get("attention.value_length", key_length),
        n_ff=get("feed_forward_length", 4 * n_embd),
        context_length=get("context_length", 0),
        n_vocab=int(n_vocab),
        file_bytes=size,
        tensor_bytes=tensor_bytes,
        metadata=meta,
    )

