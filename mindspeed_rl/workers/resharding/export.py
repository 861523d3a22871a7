"""Trainer-side snapshot export: copy on the training thread, write and publish in the background.

::

    training step t ──► export(t, named_tensors, layout, rank)
                           │  clone this rank's tensors (the step may overwrite them next)
                           ▼
                  [writer thread]  .staging-v<t>/rank-<r>.safetensors + rank-<r>.json
                           │  last rank to finish wins an O_EXCL claim and publishes:
                           ▼
                  .tmp-v<t>-<uuid>/ (shards moved in, manifest last, fsync) ──rename──► v<t>/
                           │
                           ▼  prune: keep the newest K, spare leased ones

Ranks of one export may live in different processes on a shared file
system; they coordinate only through the staging directory, so every rank
must use the same ``root_dir``. A single writer thread per process keeps a
rank's exports in version order, which is what makes in-order publishing hold.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from mindspeed_rl.workers.resharding.layout import PartitionSpec, RankCoords, TrainingLayout
from mindspeed_rl.workers.resharding.manifest import (
    MANIFEST_NAME,
    ShardEntry,
    SnapshotInfo,
    SnapshotManifest,
    TensorEntry,
)
from mindspeed_rl.workers.resharding.shardio import write_shard
from mindspeed_rl.workers.resharding.store import (
    DEFAULT_LEASE_TTL_S,
    fsync_path,
    latest_published,
    new_temp_dir,
    prune,
    publish_dir,
    snapshot_dirname,
)

__all__ = ["ExportResult", "SnapshotWriter", "latest_published"]

_CLAIM = ".publishing"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportResult:
    """What one rank's export did; the seconds feed the T_save metric."""

    version: int
    rank: int
    num_tensors: int
    num_replicas_skipped: int
    bytes_written: int
    prepare_seconds: float
    save_seconds: float
    published: SnapshotInfo | None
    pruned_versions: tuple[int, ...]


@dataclass(slots=True)
class _Prepared:
    version: int
    rank: int
    coords: RankCoords
    layout: TrainingLayout
    tensors: dict[str, torch.Tensor]
    specs: dict[str, PartitionSpec]
    skipped: int
    prepare_seconds: float
    started: float


class SnapshotWriter:
    """Exports training shards under ``root_dir`` and keeps the newest ``keep_last`` published snapshots."""

    def __init__(
        self, root_dir: Path, *, keep_last: int = 2, lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last}: keep at least the newest snapshot (keep_last >= 1)")
        self.root_dir = Path(root_dir)
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self.keep_last = keep_last
        self.lease_ttl_s = lease_ttl_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot-writer")
        self._pending: list[Future[ExportResult]] = []
        self._lock = threading.Lock()

    def export(
        self,
        version: int,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        layout: TrainingLayout,
        rank: int = 0,
    ) -> Future[ExportResult]:
        """Copy this rank's tensors now, write and publish them in the background.

        Replicated tensors are written only by coordinate 0 of each axis (see
        `TrainingLayout.writes`); the others are counted in ``num_replicas_skipped``.
        """
        if version < 0:
            raise ValueError(f"snapshot version {version} is negative; use the trainer step (>= 0)")
        prepared = _prepare(version, named_tensors, layout, rank)
        future = self._pool.submit(self._write_and_publish, prepared)
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [future]
        return future

    def wait(self, timeout: float | None = None) -> list[ExportResult]:
        """Block until every export submitted so far is written (re-raises a failed write)."""
        with self._lock:
            pending, self._pending = self._pending, []
        return [f.result(timeout=timeout) for f in pending]

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)

    def _write_and_publish(self, prep: _Prepared) -> ExportResult:
        staging = self.root_dir / staging_dirname(prep.version)
        staging.mkdir(exist_ok=True)
        shard_name = f"rank-{prep.rank:05d}.safetensors"
        partial = staging / f"{shard_name}.part"
        nbytes, entries = write_shard(partial, prep.tensors, prep.specs, shard_file=shard_name)
        os.replace(partial, staging / shard_name)
        shard = ShardEntry(file=shard_name, rank=prep.rank, coords=prep.coords, nbytes=nbytes)
        _write_rank_record(staging, shard, entries)
        published = self._publish_if_complete(staging, prep)
        pruned = prune(self.root_dir, self.keep_last, self.lease_ttl_s) if published else ()
        return ExportResult(
            version=prep.version,
            rank=prep.rank,
            num_tensors=len(entries),
            num_replicas_skipped=prep.skipped,
            bytes_written=nbytes,
            prepare_seconds=prep.prepare_seconds,
            save_seconds=time.perf_counter() - prep.started,
            published=published,
            pruned_versions=pruned,
        )

    def _publish_if_complete(self, staging: Path, prep: _Prepared) -> SnapshotInfo | None:
        records = sorted(staging.glob("rank-*.json"))
        if len(records) < prep.layout.world_size:
            return None
        try:
            claim = os.open(staging / _CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # another rank finished at the same moment and publishes
            return None
        os.close(claim)
        shards, tensors = _read_rank_records(records)
        manifest = SnapshotManifest(
            version=prep.version,
            created_unix=time.time(),
            kind="training",
            layout=prep.layout.to_json(),
            shards=shards,
            tensors=tensors,
        )
        temp = new_temp_dir(self.root_dir, prep.version)
        for shard in shards:
            os.rename(staging / shard.file, temp / shard.file)
        (temp / MANIFEST_NAME).write_text(manifest.dumps())
        fsync_path(temp / MANIFEST_NAME)
        info = publish_dir(temp, self.root_dir, prep.version)
        shutil.rmtree(staging)
        return info


def _prepare(
    version: int, named_tensors: Iterable[tuple[str, torch.Tensor]], layout: TrainingLayout, rank: int
) -> _Prepared:
    started = time.perf_counter()
    coords = layout.coords(rank)
    tensors: dict[str, torch.Tensor] = {}
    specs: dict[str, PartitionSpec] = {}
    skipped = 0
    for name, tensor in named_tensors:
        if name in tensors:
            raise ValueError(f"tensor {name!r} was given twice for snapshot v{version}; names must be unique")
        if tensor.device.type != "cpu":
            raise ValueError(f"tensor {name!r} is on {tensor.device}; move it to CPU before export")
        spec = layout.spec_for(name)
        if not layout.writes(spec, coords):
            skipped += 1
            continue
        # Copy: the next optimizer step updates parameters in place while the writer thread runs.
        tensors[name] = tensor.detach().clone(memory_format=torch.contiguous_format)
        specs[name] = spec
    return _Prepared(
        version=version,
        rank=rank,
        coords=coords,
        layout=layout,
        tensors=tensors,
        specs=specs,
        skipped=skipped,
        prepare_seconds=time.perf_counter() - started,
        started=started,
    )


def _write_rank_record(staging: Path, shard: ShardEntry, entries: tuple[TensorEntry, ...]) -> None:
    record = {"shard": shard.to_json(), "tensors": [e.to_json() for e in entries]}
    tmp = staging / f"{Path(shard.file).stem}.json.part"
    tmp.write_text(json.dumps(record))
    fsync_path(tmp)
    os.replace(tmp, staging / f"{Path(shard.file).stem}.json")


def _read_rank_records(records: list[Path]) -> tuple[tuple[ShardEntry, ...], tuple[TensorEntry, ...]]:
    shards: list[ShardEntry] = []
    tensors: list[TensorEntry] = []
    for path in records:
        record = json.loads(path.read_text())
        shards.append(ShardEntry.from_json(record["shard"]))
        tensors.extend(TensorEntry.from_json(t) for t in record["tensors"])
    return tuple(sorted(shards, key=lambda s: s.rank)), tuple(tensors)


def staging_dirname(version: int) -> str:
    return f".staging-{snapshot_dirname(version)}"
