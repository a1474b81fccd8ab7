"""The hnswlib index file: created for deletions and reuse, saved durably, searched robustly."""
from __future__ import annotations

import contextlib
import errno
import math
import os
from collections.abc import Sequence
from pathlib import Path

import hnswlib
import numpy as np

from ..errors import REINDEX, StoreError
from .fileio import fsync_dir, sha256_file

EF_BASE_COUNT = 1000  # up to this many vectors the configured ef_search is used as is
EF_MAX = 1000  # pgvector's own ceiling for hnsw.ef_search; hnswlib gets the same
# Each commit rewrites (and hashes) the whole index file, so an indexing run commits in steps of this share of the
# store (indexing.commit_step): the files written sum to ~(1 + 1/g) x the final one (g = 0.5: 3x), where steps of
# 1,024 passages wrote its square over 2,048 (a 19 MB upload: ~40 GB onto an SD card). The vectors of one step are
# held until it commits (memory.estimate counts them).
COMMIT_GROWTH = 0.5


def new(dim: int, m: int, ef_construction: int, capacity: int = 1024) -> hnswlib.Index:
    """An empty cosine index whose deleted slots new vectors may reuse (removing documents does not grow it)."""
    index = hnswlib.Index(space="cosine", dim=dim)
    index.init_index(max_elements=capacity, M=m, ef_construction=ef_construction, random_seed=0,
                     allow_replace_deleted=True)
    return index


def check_folder(folder: Path) -> None:
    """StoreError unless hnswlib can name files in ``folder``: it takes a path as UTF-8 text only, so a folder whose
    name holds other bytes (a Latin-1 name from a USB stick) failed on a TypeError at the first commit, after all
    the encoding, and a store moved there on every question."""
    try:
        str(folder).encode("utf-8")
    except UnicodeEncodeError:
        raise StoreError(f"the store folder {folder} has a name that is not UTF-8 text, which the vector index "
                         "cannot open: rename it (or name it by a link whose name is)") from None


def save(index: hnswlib.Index, path: Path) -> tuple[int, str]:
    """Write ``path`` and make it durable (file and folder fsynced); returns its size and sha256."""
    index.save_index(str(path))
    size, expected = path.stat().st_size, index.index_file_size()
    if size != expected:  # hnswlib does not check its writes: on a full disk it leaves a short file, silently
        raise OSError(errno.ENOSPC, f"wrote {size} of the index's {expected} bytes (no space left on device)",
                      str(path))
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    os.chmod(path, path.stat().st_mode & 0o755)  # never group/world-writable, whatever the umask
    fsync_dir(path.parent)
    return path.stat().st_size, sha256_file(path)


def ef_for(count: int, k: int, ef_search: int) -> int:
    """The search breadth for an index of ``count`` vectors: ``ef_search`` up to EF_BASE_COUNT vectors,
    one more ``ef_search`` per doubling beyond (17.5k vectors at 64: 328; 100k: 489), at most EF_MAX, at
    least ``k``. A fixed ef lets recall fall as the corpus grows, worst with many near-duplicates: the
    candidate list fills with the duplicates' cluster and the search never leaves it."""
    scale = 1.0 + max(0.0, math.log2(max(count, 1) / EF_BASE_COUNT))
    return max(k, min(EF_MAX, round(ef_search * scale)))


def knn(index: hnswlib.Index, query: np.ndarray, k: int, ef: int,
        below: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k labels and distances; ``below``: of labels under it only (the vectors of a commit in progress are
    in the index before they are committed), asking for more neighbours until k such are found."""
    want = k
    while True:
        labels, dists = _knn(index, query, want, ef)
        if below is None:
            return labels, dists
        keep = labels < below
        if keep.sum() >= k or want >= index.get_current_count():
            return labels[keep][:k], dists[keep][:k]
        want = min(4 * want, index.get_current_count())


def _knn(index: hnswlib.Index, query: np.ndarray, k: int, ef: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k labels and distances, searched with ``ef_for`` the index's size; with many deleted vectors
    the graph may yield fewer than k: widen ef, then ask for fewer."""
    ef = ef_for(index.get_current_count(), k, ef)
    for width in (ef, 4 * ef):
        index.set_ef(width)
        with contextlib.suppress(RuntimeError):
            labels, dists = index.knn_query(query, k=k)
            return labels[0], dists[0]
    labels, dists = index.knn_query(query, k=max(1, k // 2))
    return labels[0], dists[0]


def knn_many(index: hnswlib.Index, queries: np.ndarray, k: int, ef: int) -> np.ndarray:
    """Top-k labels of each row of ``queries`` at breadth ``ef`` as given; a row that finds fewer than k live
    vectors (deletions) asks for half as many, down to 1, and -1 pads it."""
    k = min(k, index.get_current_count())
    index.set_ef(max(ef, k))
    with contextlib.suppress(RuntimeError):
        return index.knn_query(queries, k=k)[0].astype(np.int64)
    out = np.full((len(queries), k), -1, dtype=np.int64)
    for row, query in enumerate(queries):
        want = k
        while want:
            with contextlib.suppress(RuntimeError):
                out[row, :want] = index.knn_query(query.reshape(1, -1), k=want)[0][0]
                break
            want //= 2
    return out


def cosines(index: hnswlib.Index, query: np.ndarray, ids: Sequence[int]) -> dict[int, float]:
    """Exact cosine similarity of ``query`` to the stored vectors of ``ids``; an id whose vector a commit removed
    since it was found (a lexical hit, a moment before) is left out, as its passage is."""
    q = query.reshape(-1).astype(np.float32)
    out = {}
    for i in ids:
        with contextlib.suppress(RuntimeError):  # "Label not found": deleted
            v = np.asarray(index.get_items([i], return_type="numpy")[0], dtype=np.float32)
            out[int(i)] = float(v @ q / max(float(np.linalg.norm(v) * np.linalg.norm(q)), 1e-12))
    return out


def load(path: Path, dim: int, size: int, sha256: str) -> hnswlib.Index:
    """The committed index file, checked against the size and sha256 recorded with it (StoreError otherwise)."""
    try:  # it may also be removed while read: a newer commit landed (store_load loads that one)
        intact = path.stat().st_size == size and sha256_file(path) == sha256
    except FileNotFoundError as exc:
        raise StoreError(f"vector index {path} is missing; {REINDEX}") from exc
    if not intact:
        raise StoreError(f"vector index {path} is corrupt or truncated (size/hash mismatch); {REINDEX}")
    index = hnswlib.Index(space="cosine", dim=dim)
    try:
        index.load_index(str(path), max_elements=0, allow_replace_deleted=True)
    except RuntimeError as exc:
        raise StoreError(f"vector index {path} cannot be read: {exc}; {REINDEX}") from exc
    return index
