"""Snapshots that live in memory (``weight_transport: object_store | collective``): the records
that describe them, the host buffers that carry them, and the conversion run from those buffers.

::

    TU rank r: named tensors ──host_array (views, no copy)──► ray.put per chunk, on threads ──► MemoryShard(entries, parts)
    all ranks ──────────────────────────────────────────────────────────► MemorySnapshot (SnapshotInfo.handle)
    GU:  check_snapshot (names, shapes, dtypes, sizes; the conversion planned on meta tensors)
    actor: ray.get (zero-copy views of the node's shared memory) ──iter_converted──► engine.load_weights

A ``MemorySnapshot`` is small: tensor entries (the manifest's ``TensorEntry``, without a checksum)
and ``ObjectRef`` s to the buffers. Ray keeps an object alive while any process holds a reference
to it, so a superseded version is freed once the exporter, the Control Unit and the GUs have let
go of its record: each keeps only the newest few (``ObjectStoreExporter.keep_last``).

Integrity. No byte of a memory snapshot is stored on a disk or a network file system, the hazards
the per-tensor CRC-32 of ``shared_fs`` is there for (see manifest.py); a Ray object is sealed
before anyone can read it (no reader sees a partial write) and a lost one raises on ``get``. What
every reader checks is the rest of the manifest contract: the buffers match the entries (count,
byte size, shape, dtype), the version is the one announced, and the conversion plan is complete.
A failed check rejects the snapshot; the actor keeps its weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from mindspeed_rl.weights.layout import InferenceLayout, RankCoords, TrainingLayout
from mindspeed_rl.weights.manifest import (
    NO_CHECKSUM,
    ShardEntry,
    SnapshotError,
    SnapshotManifest,
    TensorEntry,
)
from mindspeed_rl.weights.merge import NameMap
from mindspeed_rl.weights.shardio import default_io_threads, dtype_name, torch_dtype

_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

Medium = Literal["object_store", "collective"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryShard:
    """One rank's tensors: ``entries`` in order, their buffers in ``parts`` (each part an
    ``ObjectRef`` to a list of arrays, ``part_sizes[i]`` entries each; a TU rank puts one per
    put thread, a collective receiver one per bucket)."""

    shard: ShardEntry
    entries: tuple[TensorEntry, ...]
    parts: tuple[Any, ...]
    part_sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySnapshot:
    """A complete snapshot in memory; the ``handle`` of the ``SnapshotInfo`` the CU announces."""

    version: int
    run_id: str
    kind: Literal["training", "inference"]
    layout: dict[str, Any]
    shards: tuple[MemoryShard, ...]
    medium: Medium

    @property
    def nbytes(self) -> int:
        return sum(s.shard.nbytes for s in self.shards)

    def manifest(self) -> SnapshotManifest:
        """The manifest a file snapshot of the same tensors would have (for the conversion plan)."""
        return SnapshotManifest(
            version=self.version,
            created_unix=0.0,
            kind=self.kind,
            layout=self.layout,
            shards=tuple(s.shard for s in self.shards),
            tensors=tuple(e for s in self.shards for e in s.entries),
            run_id=self.run_id,
        )


def shard_key(rank: int) -> str:
    """The ``shard_file`` of rank ``rank`` (a key: there is no file)."""
    return f"rank-{rank:05d}"


def host_array(tensor: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor's bytes as a numpy array of the same-width integer type (bf16 and
    float8 included), without a copy; Ray serialises numpy buffers out of band."""
    if tensor.device.type != "cpu":
        raise ValueError(f"a {tensor.device} tensor cannot be put in host memory; move it to CPU first")
    t = tensor.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.view(_SAME_SIZE_INT[t.element_size()]).numpy()


def entry_for(
    name: str, tensor: torch.Tensor, *, key: str, layout: TrainingLayout | InferenceLayout
) -> TensorEntry:
    return TensorEntry(
        name=name,
        shape=tuple(tensor.shape),
        dtype=dtype_name(tensor.dtype),
        shard_file=key,
        nbytes=tensor.numel() * tensor.element_size(),
        checksum=NO_CHECKSUM,
        partition=layout.spec_for(name),
    )


def as_tensor(array: np.ndarray, entry: TensorEntry) -> torch.Tensor:
    """A zero-copy tensor over a buffer read from the object store, checked against its entry.

    The buffer is read-only shared memory: loaders only read what they load (vLLM copies each
    weight into its parameter), so no copy is made; torch's warning about a non-writable array
    is silenced for that reason alone."""
    dtype = torch_dtype(entry.dtype)
    if array.nbytes != entry.nbytes:
        raise SnapshotError(
            f"{entry.name}: {array.nbytes} bytes in memory, {entry.nbytes} announced; the snapshot is "
            "incomplete, do not load it"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(array.reshape(-1))
    tensor = flat.view(dtype).reshape(entry.shape)
    return tensor


def shard_tensors(shard: MemoryShard, parts: Sequence[Sequence[np.ndarray]]) -> dict[str, torch.Tensor]:
    """The tensors of ``shard`` from its parts' arrays (as returned by ``ray.get(shard.parts)``)."""
    if len(parts) != len(shard.part_sizes):
        raise SnapshotError(f"{shard.shard.file}: {len(parts)} buffers, {len(shard.part_sizes)} announced")
    arrays: list[np.ndarray] = []
    for index, (part, size) in enumerate(zip(parts, shard.part_sizes, strict=True)):
        if len(part) != size:
            raise SnapshotError(f"{shard.shard.file} part {index}: {len(part)} arrays, {size} announced")
        arrays.extend(part)
    if len(arrays) != len(shard.entries):
        raise SnapshotError(f"{shard.shard.file}: {len(arrays)} arrays for {len(shard.entries)} tensors")
    return {e.name: as_tensor(a, e) for e, a in zip(shard.entries, arrays, strict=True)}


def check_snapshot(snapshot: MemorySnapshot, version: int, layout: InferenceLayout) -> None:
    """What a GU checks before offering a memory snapshot to its actors (no tensor byte read):
    the version, every shard of the training layout present, and the conversion plan."""
    from mindspeed_rl.weights.convert import is_identity
    from mindspeed_rl.weights.streaming_merge import plan_conversion

    if snapshot.version != version:
        raise SnapshotError(f"memory snapshot holds version {snapshot.version}, announced as {version}")
    manifest = snapshot.manifest()
    if snapshot.kind == "inference":
        return
    training = manifest.training_layout()
    ranks = sorted(s.rank for s in manifest.shards)
    if ranks != list(range(training.world_size)):
        raise SnapshotError(f"snapshot v{version}: shards of ranks {ranks}, layout has {training.world_size}")
    if not is_identity(manifest, layout, NameMap()):
        plan_conversion(manifest, layout)


def iter_converted(
    snapshot: MemorySnapshot,
    tensors: Mapping[tuple[str, str], torch.Tensor],
    layout: InferenceLayout,
    *,
    rank: int = 0,
    num_threads: int | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights inference rank ``rank`` loads, one tensor at a time, converted from
    ``tensors`` (keyed by ``(shard key, name)``): the identity layout yields the buffers
    themselves, a merge runs the same plan as the file converter, group by group: by default one at
    a time, so host memory holds one group's merged tensors on top of the buffers. ``num_threads``
    > 1 converts that many groups at once and holds every merged tensor until the end (measured
    here on a loaded 2-core host: no faster, 1 GB more peak RSS, so not the default)."""
    from mindspeed_rl.weights.convert import is_identity
    from mindspeed_rl.weights.streaming_merge import convert_group_in_memory, plan_conversion

    manifest = snapshot.manifest()
    if snapshot.kind == "inference":
        key = shard_key(rank)
        for entry in manifest.tensors:
            if entry.shard_file == key:
                yield entry.name, tensors[(key, entry.name)]
        return
    if is_identity(manifest, layout, NameMap()):
        for entry in manifest.tensors:
            yield entry.name, tensors[(entry.shard_file, entry.name)]
        return
    plan = plan_conversion(manifest, layout)
    threads = num_threads or 1  # see the docstring: threads trade host memory for (unmeasured) speed
    if threads <= 1:
        for group in plan.groups:
            out: list[tuple[str, torch.Tensor]] = []
            convert_group_in_memory(group, plan, tensors, layout, collect_rank(out, rank))
            yield from out
        return
    # Several groups at once (numpy copies release the GIL), their bytes in flight bounded by the
    # largest group's (streaming_merge's budget); yielded in plan order once all are converted:
    # the engine's loader materialises the whole update anyway (GenerationActor._load_tensors).
    from mindspeed_rl.weights.streaming_merge import run_groups_bounded

    per_group: list[list[tuple[str, torch.Tensor]]] = [[] for _ in plan.groups]
    index = {id(g): i for i, g in enumerate(plan.groups)}

    def convert(group: Any) -> None:
        convert_group_in_memory(group, plan, tensors, layout, collect_rank(per_group[index[id(group)]], rank))

    run_groups_bounded(plan, convert, threads)
    for out in per_group:
        yield from out


def collect_rank(out: list[tuple[str, torch.Tensor]], rank: int) -> Any:
    """A conversion sink keeping inference rank ``rank``'s tensors in ``out``."""

    def sink(r: int, name: str, tensor: torch.Tensor) -> None:
        if r == rank:
            out.append((name, tensor))

    return sink


def fetch_tensors(snapshot: MemorySnapshot, get: Any) -> dict[tuple[str, str], torch.Tensor]:
    """Every shard's tensors of ``snapshot``; ``get`` is ``ray.get`` (a lost object raises
    ``SnapshotError``: a superseded version freed before this reader got to it)."""
    refs = [ref for shard in snapshot.shards for ref in shard.parts]
    try:
        values = get(refs)
    except Exception as err:  # Ray's ObjectLostError / OwnerDiedError / ReferenceCountingAssertionError
        raise SnapshotError(
            f"memory snapshot v{snapshot.version} is no longer in the object store ({type(err).__name__}): "
            "a newer version superseded it or its Training Unit died"
        ) from err
    out: dict[tuple[str, str], torch.Tensor] = {}
    at = 0
    for shard in snapshot.shards:
        n = len(shard.parts)
        for name, tensor in shard_tensors(shard, values[at : at + n]).items():
            out[(shard.shard.file, name)] = tensor
        at += n
    return out


def memory_shard(
    rank: int,
    coords: RankCoords,
    named: Iterable[tuple[str, torch.Tensor]],
    layout: TrainingLayout | InferenceLayout,
    put: Any,
    *,
    num_parts: int | None = None,
) -> MemoryShard:
    """``put`` (``ray.put``) one rank's tensors as host arrays, in ``num_parts`` objects of about
    equal bytes put side by side (default: the I/O threads of a shard write): the copy into the
    object store is the export's only copy (the next optimizer step may update them in place)."""
    key = shard_key(rank)
    entries: list[TensorEntry] = []
    arrays: list[np.ndarray] = []
    for name, tensor in named:
        entries.append(entry_for(name, tensor, key=key, layout=layout))
        arrays.append(host_array(tensor))
    chunks = _contiguous_chunks(arrays, num_parts or default_io_threads())
    if len(chunks) == 1:
        refs = [put(chunks[0])]
    else:
        # One put per chunk, side by side: a put copies on the calling thread with the GIL
        # released, and one thread did not reach a plain copy's speed here (measured ~2x slower).
        with ThreadPoolExecutor(max_workers=len(chunks), thread_name_prefix="object-store-put") as pool:
            refs = list(pool.map(put, chunks))
    nbytes = sum(e.nbytes for e in entries)
    shard = ShardEntry(file=key, rank=rank, coords=coords, nbytes=nbytes)
    return MemoryShard(
        shard=shard, entries=tuple(entries), parts=tuple(refs), part_sizes=tuple(len(c) for c in chunks)
    )


def _contiguous_chunks(arrays: list[np.ndarray], parts: int) -> list[list[np.ndarray]]:
    """``arrays`` cut, in order, into at most ``parts`` runs of about equal bytes (never empty)."""
    total = sum(a.nbytes for a in arrays)
    if parts <= 1 or len(arrays) <= 1 or total == 0:
        return [arrays]
    target = total / parts
    chunks: list[list[np.ndarray]] = [[]]
    size = 0
    for array in arrays:
        if chunks[-1] and size >= target and len(chunks) < parts:
            chunks.append([])
            size = 0
        chunks[-1].append(array)
        size += array.nbytes
    return chunks
