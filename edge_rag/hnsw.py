"""The hnswlib index file: created for deletions and reuse, saved durably, searched robustly."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import hnswlib
import numpy as np

from .fileio import fsync_dir, sha256_file


def new(dim: int, m: int, ef_construction: int, capacity: int = 1024) -> hnswlib.Index:
    """An empty cosine index whose deleted slots new vectors may reuse (removing documents does not grow it)."""
    index = hnswlib.Index(space="cosine", dim=dim)
    index.init_index(max_elements=capacity, M=m, ef_construction=ef_construction, random_seed=0,
                     allow_replace_deleted=True)
    return index


def save(index: hnswlib.Index, path: Path) -> tuple[int, str]:
    """Write ``path`` and make it durable (file and folder fsynced); returns its size and sha256."""
    index.save_index(str(path))
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    os.chmod(path, path.stat().st_mode & 0o755)  # never group/world-writable, whatever the umask
    fsync_dir(path.parent)
    return path.stat().st_size, sha256_file(path)


def knn(index: hnswlib.Index, query: np.ndarray, k: int, ef: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k labels and distances; with many deleted vectors the graph may yield fewer than k: widen
    ef, then ask for fewer."""
    for width in (max(ef, k), 4 * max(ef, k)):
        index.set_ef(width)
        with contextlib.suppress(RuntimeError):
            labels, dists = index.knn_query(query, k=k)
            return labels[0], dists[0]
    labels, dists = index.knn_query(query, k=max(1, k // 2))
    return labels[0], dists[0]
