"""Trainer-side snapshot export: copy on the training thread, write and publish in the background.

::

    training step t ──► export(t, named_tensors, layout, rank)
                           │  drop a still-queued older export of this rank (superseded)
                           │  clone this rank's tensors (the step may overwrite them next)
                           ▼
              one-slot queue per rank ──► [writer thread, one export at a time]
                           │  .staging-v<t>/rank-<r>.safetensors (+ CRC while writing) + rank-<r>.json
                           │  last rank to finish wins an O_EXCL claim and publishes:
                           ▼
                  .tmp-v<t>-<uuid>/ (shards moved in, manifest last, fsync) ──rename──► v<t>/
                           │
                           ▼  prune: keep this run's newest K, spare leased ones

Bounded memory: at most one export per rank is being written and one waits; a newer
request replaces the waiting one (``num_superseded``) *before* its own clone is made,
so host memory never holds more than the copy being written plus one queued copy, even
when a save is slower than a training step. The Control Unit tolerates the skipped
versions: actors always reload to the newest. A superseded export's future resolves
to an `ExportResult` with ``superseded=True`` and nothing published.

Ranks of one export may live in different processes on a shared file system; they
coordinate only through the staging directory, so every rank must use the same
``root_dir`` and the same ``run_id``. The single writer thread keeps a rank's exports in
version order, which is what makes in-order publishing hold. A version superseded on
some ranks but written by others never publishes; its staging dir is removed once a
newer version publishes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mindspeed_rl.weights.hostcopy import copy_tensors
from mindspeed_rl.weights.layout import PartitionSpec, RankCoords, TrainingLayout
from mindspeed_rl.weights.manifest import (
    MANIFEST_NAME,
    ShardEntry,
    SnapshotInfo,
    SnapshotManifest,
    TensorEntry,
)
from mindspeed_rl.weights.shardio import write_shard
from mindspeed_rl.weights.store import (
    DEFAULT_LEASE_TTL_S,
    check_run_id,
    fsync_path,
    latest_published,
    list_published,
    new_temp_dir,
    prune,
    publish_dir,
    snapshot_dirname,
    snapshot_run_id,
)

__all__ = ["ExportResult", "SnapshotWriter", "latest_published"]

logger = logging.getLogger(__name__)
_CLAIM = ".publishing"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportResult:
    """What one rank's export did; the seconds feed the T_save metric.

    ``prepare_seconds``: the copy on the trainer's thread (all the trainer waits for).
    ``save_seconds``: from the export call until published (copy, queue wait, write, publish).
    ``write_seconds``: the writer thread's part only (write the shard, publish, prune).
    ``superseded``: a newer export of this rank replaced it while it waited; nothing was written.
    """

    version: int
    rank: int
    num_tensors: int
    num_replicas_skipped: int
    bytes_written: int
    prepare_seconds: float
    save_seconds: float
    published: SnapshotInfo | None
    pruned_versions: tuple[int, ...]
    write_seconds: float = 0.0
    superseded: bool = False
    handle: Any = None
    """A memory snapshot (``weight_transport`` object_store / collective): the
    ``MemorySnapshot`` the TU announces with it; None for a file snapshot."""


@dataclass(slots=True, eq=False)
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


@dataclass(slots=True, eq=False)  # compared by identity: its fields hold tensors
class _Request:
    prepared: _Prepared | None  # None once written or superseded, so the clone is freed
    future: Future[ExportResult]


class SnapshotWriter:
    """Exports training shards under ``root_dir`` and keeps this run's newest ``keep_last`` snapshots.

    ``run_id`` is recorded in every manifest; retention never touches another run's
    snapshots. Default: a fresh id per writer (right for one exporting process; ranks in
    several processes must pass a shared one). ``num_threads``: I/O threads per shard write.
    """

    def __init__(
        self,
        root_dir: Path,
        *,
        keep_last: int = 2,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        run_id: str | None = None,
        num_threads: int | None = None,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last}: keep at least the newest snapshot (keep_last >= 1)")
        self.root_dir = Path(root_dir)
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self.keep_last = keep_last
        self.lease_ttl_s = lease_ttl_s
        self.run_id = check_run_id(run_id) if run_id is not None else uuid.uuid4().hex[:16]
        self.num_threads = num_threads
        self.num_superseded = 0
        self._cond = threading.Condition()
        self._queued: list[_Request] = []
        self._submitted: list[Future[ExportResult]] = []
        self._last_version: dict[int, int] = {}
        self._closed = False
        # Serializes export() callers: the two-copies bound needs "drop, then clone" to be atomic.
        self._export_lock = threading.Lock()
        self._warn_foreign()
        self._thread = threading.Thread(target=self._run, name="snapshot-writer", daemon=True)
        self._thread.start()

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
        with self._export_lock:
            last = self._last_version.get(rank)
            if last is not None and version <= last:
                raise ValueError(
                    f"snapshot v{version} of rank {rank} after v{last}: policy versions must increase, "
                    f"export version {last + 1} or later"
                )
            layout.coords(rank)  # a bad rank is the caller's error: raise it before superseding anything
            self._supersede_queued(rank)
            prepared = _prepare(version, named_tensors, layout, rank, num_threads=self.num_threads)
            request = _Request(prepared=prepared, future=Future())
            with self._cond:
                if self._closed:
                    raise RuntimeError("SnapshotWriter.export after close(); create a new writer")
                self._last_version[rank] = version
                self._queued.append(request)
                self._submitted = [f for f in self._submitted if not f.done()] + [request.future]
                self._cond.notify_all()
        return request.future

    def wait(self, timeout: float | None = None) -> list[ExportResult]:
        """Block until every export submitted so far is written or superseded (re-raises a failed write)."""
        with self._cond:
            pending, self._submitted = self._submitted, []
        return [f.result(timeout=timeout) for f in pending]

    def close(self) -> None:
        """Write what is queued, then stop the writer thread; re-raises a failed write."""
        try:
            self.wait()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._thread.join()

    def _supersede_queued(self, rank: int) -> None:
        with self._cond:
            older = [r for r in self._queued if r.prepared is not None and r.prepared.rank == rank]
            self._queued = [r for r in self._queued if r not in older]
            self.num_superseded += len(older)
        for request in older:
            prep = request.prepared
            assert prep is not None
            request.prepared = None  # the clone goes now, before the new one is made
            logger.info(
                "snapshot v%d of rank %d superseded by a newer export while queued", prep.version, rank
            )
            request.future.set_result(_superseded_result(prep))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queued and not self._closed:
                    self._cond.wait()
                if not self._queued:
                    return
                request = self._queued.pop(0)
            prep, request.prepared = request.prepared, None
            assert prep is not None
            try:
                result = self._write_and_publish(prep)
            except Exception as err:  # handed to the caller through the future
                del prep
                request.future.set_exception(err)
            else:
                del prep
                request.future.set_result(result)

    def _warn_foreign(self) -> None:
        foreign = [i.version for i in list_published(self.root_dir) if snapshot_run_id(i.path) != self.run_id]
        if foreign:
            logger.warning(
                "snapshot root %s holds v%s of other runs; this run (%s) neither counts nor deletes them, "
                "and publishing one of those versions will fail: give each run its own folder (store.run_root)",
                self.root_dir,
                ",".join(map(str, foreign)),
                self.run_id,
            )

    def _write_and_publish(self, prep: _Prepared) -> ExportResult:
        write_started = time.perf_counter()
        staging = self.root_dir / staging_dirname(prep.version)
        staging.mkdir(exist_ok=True)
        shard_name = f"rank-{prep.rank:05d}.safetensors"
        partial = staging / f"{shard_name}.part"
        nbytes, entries = write_shard(
            partial, prep.tensors, prep.specs, shard_file=shard_name, num_threads=self.num_threads
        )
        os.replace(partial, staging / shard_name)
        shard = ShardEntry(file=shard_name, rank=prep.rank, coords=prep.coords, nbytes=nbytes)
        _write_rank_record(staging, shard, entries)
        published = self._publish_if_complete(staging, prep)
        pruned = (
            prune(self.root_dir, self.keep_last, self.lease_ttl_s, run_id=self.run_id) if published else ()
        )
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
            write_seconds=time.perf_counter() - write_started,
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
            run_id=self.run_id,
        )
        temp = new_temp_dir(self.root_dir, prep.version)
        for shard in shards:
            os.rename(staging / shard.file, temp / shard.file)
        (temp / MANIFEST_NAME).write_text(manifest.dumps())
        fsync_path(temp / MANIFEST_NAME)
        info = publish_dir(temp, self.root_dir, prep.version)
        shutil.rmtree(staging)
        return info


def _superseded_result(prep: _Prepared) -> ExportResult:
    return ExportResult(
        version=prep.version,
        rank=prep.rank,
        num_tensors=len(prep.tensors),
        num_replicas_skipped=prep.skipped,
        bytes_written=0,
        prepare_seconds=prep.prepare_seconds,
        save_seconds=0.0,
        published=None,
        pruned_versions=(),
        superseded=True,
    )


def _prepare(
    version: int,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    layout: TrainingLayout,
    rank: int,
    *,
    num_threads: int | None = None,
) -> _Prepared:
    started = time.perf_counter()
    coords = layout.coords(rank)
    chosen: dict[str, torch.Tensor] = {}
    specs: dict[str, PartitionSpec] = {}
    skipped = 0
    for name, tensor in named_tensors:
        if name in chosen:
            raise ValueError(f"tensor {name!r} was given twice for snapshot v{version}; names must be unique")
        if tensor.device.type != "cpu":
            raise ValueError(f"tensor {name!r} is on {tensor.device}; move it to CPU before export")
        spec = layout.spec_for(name)
        if not layout.writes(spec, coords):
            skipped += 1
            continue
        chosen[name] = tensor
        specs[name] = spec
    # Copy: the next optimizer step updates parameters in place while the writer thread runs.
    copies = copy_tensors(list(chosen.values()), num_threads=num_threads)
    return _Prepared(
        version=version,
        rank=rank,
        coords=coords,
        layout=layout,
        tensors=dict(zip(chosen, copies, strict=True)),
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
