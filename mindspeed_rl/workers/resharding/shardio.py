"""Write one shard file, and read one back verified against the manifest.

Reading is the parallel loader: tensors are binned by size across a thread
pool (big tensors end up alone in a bin, small ones grouped, the same idea as
the paper's H2D streams) and each thread opens its own safetensors handle.
CRC-32 and safetensors' copy both release the GIL, so threads overlap.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from mindspeed_rl.workers.resharding.layout import PartitionSpec
from mindspeed_rl.workers.resharding.manifest import (
    ShardEntry,
    SnapshotError,
    SnapshotManifest,
    TensorEntry,
    checksum_bytes,
)
from mindspeed_rl.workers.resharding.store import fsync_path


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_checksum(tensor: torch.Tensor) -> str:
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return checksum_bytes(raw.numpy().data)


def write_shard(
    path: Path,
    tensors: Mapping[str, torch.Tensor],
    specs: Mapping[str, PartitionSpec],
    *,
    shard_file: str | None = None,
) -> tuple[int, tuple[TensorEntry, ...]]:
    """Write ``tensors`` to ``path`` (fsynced); return the file size and one manifest entry per tensor.

    ``shard_file`` is the name recorded in the entries when ``path`` is a temporary name.
    """
    entries = tuple(
        TensorEntry(
            name=name,
            shape=tuple(t.shape),
            dtype=dtype_name(t.dtype),
            shard_file=shard_file or path.name,
            nbytes=t.numel() * t.element_size(),
            checksum=tensor_checksum(t),
            partition=specs[name],
        )
        for name, t in tensors.items()
    )
    save_file(dict(tensors), str(path))
    fsync_path(path)
    return os.path.getsize(path), entries


def read_shard(
    snapshot_dir: Path, manifest: SnapshotManifest, shard: ShardEntry, *, num_threads: int = 4
) -> dict[str, torch.Tensor]:
    """Load every tensor of ``shard`` and check it against the manifest; raise SnapshotError on any mismatch."""
    path = Path(snapshot_dir) / shard.file
    if not path.is_file():
        raise SnapshotError(f"snapshot v{manifest.version}: shard file {path} is missing")
    size = path.stat().st_size
    if size != shard.nbytes:
        raise SnapshotError(
            f"snapshot v{manifest.version}: {path} has {size} bytes, manifest says {shard.nbytes} (truncated or rewritten)"
        )
    entries = manifest.tensors_in(shard.file)
    try:
        _check_names(path, entries)
        bins = _bin_by_size(entries, max(1, num_threads))
        if len(bins) == 1:
            parts = [_read_bin(path, bins[0])]
        else:
            with ThreadPoolExecutor(max_workers=len(bins), thread_name_prefix="snapshot-read") as pool:
                parts = list(pool.map(lambda group: _read_bin(path, group), bins))
    except (SafetensorError, OSError) as err:
        raise SnapshotError(f"snapshot v{manifest.version}: cannot read {path}: {err}") from err
    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        merged.update(part)
    return merged


def _check_names(path: Path, entries: Sequence[TensorEntry]) -> None:
    with safe_open(str(path), framework="pt") as handle:
        present = set(handle.keys())
    expected = {e.name for e in entries}
    if present != expected:
        missing = sorted(expected - present)[:5]
        extra = sorted(present - expected)[:5]
        raise SnapshotError(
            f"{path}: tensors differ from the manifest (missing {missing}, unexpected {extra})"
        )


def _bin_by_size(entries: Sequence[TensorEntry], num_bins: int) -> list[list[TensorEntry]]:
    """Greedy largest-first into the lightest bin: big tensors spread out, small ones share a bin."""
    bins: list[list[TensorEntry]] = [[] for _ in range(min(num_bins, max(1, len(entries))))]
    loads = [0] * len(bins)
    for entry in sorted(entries, key=lambda e: e.nbytes, reverse=True):
        lightest = loads.index(min(loads))
        bins[lightest].append(entry)
        loads[lightest] += entry.nbytes
    return bins


def _read_bin(path: Path, entries: Sequence[TensorEntry]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as handle:
        for entry in entries:
            tensor = handle.get_tensor(entry.name)
            _verify(path, entry, tensor)
            out[entry.name] = tensor
    return out


def _verify(path: Path, entry: TensorEntry, tensor: torch.Tensor) -> None:
    if tuple(tensor.shape) != entry.shape or dtype_name(tensor.dtype) != entry.dtype:
        raise SnapshotError(
            f"{path}: {entry.name} is {dtype_name(tensor.dtype)}{list(tensor.shape)}, "
            f"manifest says {entry.dtype}{list(entry.shape)}"
        )
    actual = tensor_checksum(tensor)
    if actual != entry.checksum:
        raise SnapshotError(
            f"{path}: {entry.name} checksum {actual} != manifest {entry.checksum} (corrupted)"
        )
