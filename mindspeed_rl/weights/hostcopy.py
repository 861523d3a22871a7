"""Host-memory copies for the weight flow that do not go through torch's intra-op thread pool.

Why: torch's CPU copy kernels (``clone``, ``cat``, ``contiguous``) split each copy over the
OpenMP pool, whose threads spin-wait. On a host whose cores are shared (a trainer beside
rollout engines, or this 2-core machine), that is pathological: measured here, cloning a
64 MB model took 1.0-2.4 s with 2 intra-op threads on a loaded host and 0.025 s with one.
A memory copy needs no pool: numpy performs it as one memcpy per array with the GIL
released, so our own I/O thread pool (a few threads, one per bin of tensors) spreads big
models over cores without ever oversubscribing them.

Tensors are viewed as same-size integers, so every dtype (bfloat16 and float8 included,
which numpy does not know) copies bit for bit. Meta tensors (shapes only) go through torch, which
allocates nothing for them: the converter plans a conversion by running it on meta tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from mindspeed_rl.weights.shardio import run_in_bins

_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.device.type != "cpu":
        raise ValueError(f"a {tensor.device} tensor cannot be copied on the host; move it to CPU first")
    return tensor.detach().view(_SAME_SIZE_INT[tensor.element_size()]).numpy()


def _to_torch(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(array).view(dtype)


def copy_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy that owns its memory (strided sources included)."""
    if tensor.is_meta:
        return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
    return _to_torch(np.array(_as_numpy(tensor), order="C", copy=True), tensor.dtype)


def copy_tensors(
    tensors: Sequence[torch.Tensor],
    *,
    num_threads: int | None = None,
    into: Sequence[torch.Tensor | None] | None = None,
) -> list[torch.Tensor]:
    """`copy_tensor` of each, in order, binned by size over up to ``num_threads`` threads.
    ``into``: per tensor, memory to copy it into instead (contiguous, its dtype and shape; None:
    fresh memory). Why reuse: a fresh allocation above glibc's mmap threshold (32 MiB) is new
    pages every time, which fault on first touch (see ``Arena``); ``DeltaEncoder.take_spare``
    measured it: a 366 MB export copy took 0.2-0.4 s into fresh memory, 0.03 s into reused."""
    if into is None:
        return run_in_bins(tensors, lambda t: t.numel() * t.element_size(), copy_tensor, num_threads)
    if len(into) != len(tensors):
        raise ValueError(f"{len(into)} targets for {len(tensors)} tensors; give one per tensor (None: fresh)")

    def one(pair: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
        source, target = pair
        if target is None:
            return copy_tensor(source)
        if not target.is_contiguous():  # the copy must own contiguous memory, as copy_tensor's does
            raise ValueError(
                f"cannot copy {list(source.shape)} into a strided tensor; pass contiguous memory"
            )
        copy_into(target, source)  # refuses another dtype or shape
        return target

    pairs = list(zip(tensors, into, strict=True))
    return run_in_bins(pairs, lambda pair: pair[0].numel() * pair[0].element_size(), one, num_threads)


def copy_into(target: torch.Tensor, source: torch.Tensor) -> None:
    """``target[...] = source`` for tensors of one dtype and shape (``target`` may be a strided
    view): on the host through numpy (the GIL released), on a device by the device's own copy
    (the colocated push merges on the device, ``megatron/colocated_push.py``)."""
    if target.dtype != source.dtype or target.shape != source.shape:
        raise ValueError(
            f"cannot copy a {source.dtype}{list(source.shape)} tensor into a {target.dtype}{list(target.shape)} one"
        )
    if target.device.type != "cpu" or source.device.type != "cpu":
        target.copy_(source)
        return
    np.copyto(_as_numpy(target), _as_numpy(source))


def cat(tensors: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.cat`` for CPU tensors of one dtype, without torch's thread pool."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise ValueError(
            f"cannot concatenate tensors of dtypes {sorted(map(str, dtypes))}; convert them first"
        )
    if len(tensors) == 1:
        return tensors[0]
    if any(t.is_meta for t in tensors):
        return torch.cat(list(tensors), dim=dim)
    joined = np.concatenate([_as_numpy(t) for t in tensors], axis=dim)
    return _to_torch(joined, tensors[0].dtype)


class Arena:
    """Reused host memory for short-lived tensors: ``take`` cuts aligned pieces off one buffer,
    ``reset`` makes all of it free again (every tensor taken since must be dead by then).

    Why: a fresh allocation of this size is an ``mmap`` whose pages fault on first touch:
    measured here, copying into fresh memory ran at ~3 GB/s, into touched memory at ~8 GB/s.
    A receiver that merges a bucket round, puts it (a copy) and drops it reuses the same pages
    every round. A request past the buffer gets fresh memory and the next ``reset`` grows the
    buffer to the largest round seen, so the arena holds one round's bytes, not the model.
    """

    _ALIGN = 64

    def __init__(self) -> None:
        self._buffer = np.empty(0, dtype=np.uint8)
        self._used = 0
        self._wanted = 0

    @property
    def nbytes(self) -> int:
        return self._buffer.nbytes

    def take(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(int(size) for size in shape) * dtype.itemsize
        start = self._used
        self._used = start + (nbytes + self._ALIGN - 1) // self._ALIGN * self._ALIGN
        self._wanted = max(self._wanted, self._used)
        if self._used > self._buffer.nbytes:
            return torch.empty(tuple(shape), dtype=dtype)
        return _to_torch(self._buffer[start : start + nbytes], dtype).view(tuple(shape))

    def reset(self) -> None:
        if self._wanted > self._buffer.nbytes:
            self._buffer = np.empty(self._wanted, dtype=np.uint8)
        self._used = 0
