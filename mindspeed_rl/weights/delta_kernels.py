"""The delta codec's passes over every word, as compiled loops (numba, a core dependency: the
ASP scheduler's kernels use it too).

Why compiled: the encoder's compare is the largest term of a delta refresh on one host. numpy
needs three passes for it (``old != new`` into a fresh bool array, ``flatnonzero`` over that
array, then ``new[idx]``), and the wire form two more over the indices (their low 16 bits, a
``bincount`` of their blocks). One loop reads both arrays once and writes the wire form
directly: on the 2-core host, 183 M bf16 words with 1.7 % changed took 0.07 s against numpy's
0.18 s on one thread (``benchmarks/snapshot_io.py --delta`` measures the encode per refresh).

``nogil``: the encoder runs one tensor per thread (``delta._map``), so the loops overlap on
cores as numpy's passes did. Where numba is missing (an environment built without the core
dependencies, such as the GPU check's bare host), numpy's passes give the same arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - every environment this project builds has numba
    numba = None


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    return None if numba is None else numba.njit(cache=True, nogil=True)(fn)


def _sparse_words_loop(
    old: np.ndarray,
    new: np.ndarray,
    low: np.ndarray,
    values: np.ndarray,
    blocks: np.ndarray,
    write_back: bool,
) -> int:
    n = 0
    for i in range(new.size):
        word = new[i]
        if old[i] != word:
            low[n] = i & 0xFFFF
            values[n] = word
            blocks[i >> 16] += 1
            if write_back:
                old[i] = word
            n += 1
    return n


_sparse_words = _compiled(_sparse_words_loop)


def _sparse_words_numpy(
    old: np.ndarray,
    new: np.ndarray,
    low: np.ndarray,
    values: np.ndarray,
    blocks: np.ndarray,
    write_back: bool,
) -> int:
    idx = np.flatnonzero(old != new)
    n = idx.size
    low[:n] = idx & 0xFFFF
    values[:n] = new[idx]
    blocks[:] = np.bincount(idx >> 16, minlength=blocks.size)
    if write_back:
        old[idx] = values[:n]
    return n


def sparse_words(
    old: np.ndarray, new: np.ndarray, *, write_back: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The words of ``new`` whose bits differ from ``old`` (flat arrays of one unsigned dtype),
    in the wire form ``delta.TensorDelta`` carries: each one's flat index's low 16 bits
    (uint16, ascending), its new word, and how many fall in each block of 65536 (uint32).
    ``write_back``: those words are also written into ``old`` (the encoder's base advanced in
    place). NaN payloads and -0.0 / 0.0 differ as their bits do."""
    if old.shape != new.shape or old.dtype != new.dtype or old.ndim != 1:
        raise ValueError(f"compare flat words of one dtype: {old.dtype}{old.shape} vs {new.dtype}{new.shape}")
    # Room for every word: pages are faulted in only as far as the loop writes.
    low = np.empty(new.size, dtype=np.uint16)
    values = np.empty(new.size, dtype=new.dtype)
    blocks = np.zeros((new.size + 0xFFFF) >> 16, dtype=np.uint32)
    n = (_sparse_words or _sparse_words_numpy)(old, new, low, values, blocks, write_back)
    return low[:n].copy(), values[:n].copy(), blocks


def _scatter_words_loop(flat: np.ndarray, low: np.ndarray, values: np.ndarray, blocks: np.ndarray) -> None:
    k = 0
    for block in range(blocks.size):
        base = block << 16
        for _ in range(blocks[block]):
            flat[base + low[k]] = values[k]
            k += 1


_scatter_words = _compiled(_scatter_words_loop)


def _scatter_words_numpy(flat: np.ndarray, low: np.ndarray, values: np.ndarray, blocks: np.ndarray) -> None:
    high = np.repeat(np.arange(blocks.size, dtype=np.int64) << 16, blocks.astype(np.int64))
    flat[high + low] = values


def sparse_misfit(flat: np.ndarray, low: np.ndarray, values: np.ndarray, blocks: np.ndarray) -> str | None:
    """Why a sparse part (``sparse_words``' arrays) cannot be scattered into ``flat``, or None.
    Cheap (block counts and the last block's indices only), so a receiver checks every part
    before it changes any tensor."""
    total = int(blocks.sum(dtype=np.int64))
    if low.size != values.size or total != values.size:
        return f"{values.size} words with {low.size} indices and block counts summing to {total}"
    if blocks.size != (flat.size + 0xFFFF) >> 16 or values.dtype != flat.dtype:
        return f"{blocks.size} blocks of {values.dtype} for {flat.size} {flat.dtype} words"
    # Only the last block can name a word past the end (the loop checks no bounds).
    last = blocks.size - 1
    tail = low[values.size - int(blocks[last]) :] if blocks.size else low[:0]
    if tail.size and (last << 16) + int(tail.max()) >= flat.size:
        return f"index {(last << 16) + int(tail.max())} of {flat.size} words"
    return None


def scatter_words(flat: np.ndarray, low: np.ndarray, values: np.ndarray, blocks: np.ndarray) -> None:
    """``sparse_words``' inverse: write ``values`` into ``flat`` at the indices the wire form
    names. Raises ValueError, before writing anything, where the parts do not fit ``flat``."""
    misfit = sparse_misfit(flat, low, values, blocks)
    if misfit is not None:
        raise ValueError(f"a sparse part does not fit: {misfit}")
    (_scatter_words or _scatter_words_numpy)(flat, low, values, blocks)
