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
newer version publishes. The queue, the supersede rule and the writer thread are the
transports' shared ``ExportQueue`` (export_queue.py); this module is the shared_fs medium.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mindspeed_rl.weights.export_queue import ExportQueue, Pending
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

__all__ = ["ExportResult", "SnapshotWriter", "export_result", "latest_published"]

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


@dataclass(slots=True, eq=False)  # compared by identity: its fields hold tensors
class _Prepared:
    coords: RankCoords
    tensors: dict[str, torch.Tensor]
    specs: dict[str, PartitionSpec]


class SnapshotWriter(ExportQueue[_Prepared]):
    """Exports training shards under ``root_dir`` and keeps this run's newest ``keep_last`` snapshots.

    ``run_id`` is recorded in every manifest; retention never touches another run's
    snapshots. Default: a fresh id per writer (right for one exporting process; ranks in
    several processes must pass a shared one). ``num_threads``: I/O threads per shard write.
    """

    _closed_hint = "create a new writer"

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
        self._warn_foreign()
        super().__init__(thread_name="snapshot-writer")

    def _payload(
        self, version: int, chosen: list[tuple[str, torch.Tensor]], layout: TrainingLayout, rank: int
    ) -> _Prepared:
        return _prepare(chosen, layout, rank, num_threads=self.num_threads, reuse=self._reuse(rank, chosen))

    def _reuse(self, rank: int, chosen: list[tuple[str, torch.Tensor]]) -> Mapping[str, torch.Tensor] | None:
        """Memory this rank's copy of ``chosen`` may go into (``_prepare``): none for a full export."""
        return None

    def _superseded(self, pending: Pending[_Prepared]) -> ExportResult:
        return export_result(pending, bytes_written=0, save_seconds=0.0, published=None, superseded=True)

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

    def _publish(self, pending: Pending[_Prepared]) -> ExportResult:
        prep = pending.payload
        assert prep is not None
        write_started = time.perf_counter()
        staging = self.root_dir / staging_dirname(pending.version)
        staging.mkdir(exist_ok=True)
        shard_name = f"rank-{pending.rank:05d}.safetensors"
        partial = staging / f"{shard_name}.part"
        nbytes, entries = write_shard(
            partial, prep.tensors, prep.specs, shard_file=shard_name, num_threads=self.num_threads
        )
        os.replace(partial, staging / shard_name)
        shard = ShardEntry(file=shard_name, rank=pending.rank, coords=prep.coords, nbytes=nbytes)
        _write_rank_record(staging, shard, entries)
        published = self._publish_if_complete(staging, pending)
        pruned = (
            prune(self.root_dir, self.keep_last, self.lease_ttl_s, run_id=self.run_id) if published else ()
        )
        return export_result(
            pending,
            bytes_written=nbytes,
            save_seconds=time.perf_counter() - pending.started,
            published=published,
            pruned=pruned,
            write_seconds=time.perf_counter() - write_started,
        )

    def _publish_if_complete(self, staging: Path, pending: Pending[_Prepared]) -> SnapshotInfo | None:
        records = sorted(staging.glob("rank-*.json"))
        if len(records) < pending.layout.world_size:
            return None
        try:
            claim = os.open(staging / _CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # another rank finished at the same moment and publishes
            return None
        except FileNotFoundError:  # another rank has published this version and cleared its staging
            return None
        os.close(claim)
        shards, tensors = _read_rank_records(records)
        manifest = SnapshotManifest(
            version=pending.version,
            created_unix=time.time(),
            kind="training",
            layout=pending.layout.to_json(),
            shards=shards,
            tensors=tensors,
            run_id=self.run_id,
        )
        temp = new_temp_dir(self.root_dir, pending.version)
        for shard in shards:
            os.rename(staging / shard.file, temp / shard.file)
        (temp / MANIFEST_NAME).write_text(manifest.dumps())
        fsync_path(temp / MANIFEST_NAME)
        info = publish_dir(temp, self.root_dir, pending.version)
        # Renamed away before it is deleted: rmtree unlinks the claim before the records, and a rank
        # that listed every record just before must then find no folder, not one it can claim again.
        trash = self.root_dir / f".trash-v{pending.version}-{uuid.uuid4().hex[:12]}"
        os.rename(staging, trash)
        shutil.rmtree(trash)
        return info


def export_result(
    pending: Pending[Any],
    *,
    bytes_written: int,
    save_seconds: float,
    published: SnapshotInfo | None,
    pruned: tuple[int, ...] = (),
    write_seconds: float = 0.0,
    superseded: bool = False,
    handle: Any = None,
) -> ExportResult:
    """One rank's ``ExportResult`` for any transport (the memory transports pass ``handle``)."""
    return ExportResult(
        version=pending.version,
        rank=pending.rank,
        num_tensors=pending.num_tensors,
        num_replicas_skipped=pending.skipped,
        bytes_written=bytes_written,
        prepare_seconds=pending.prepare_seconds,
        save_seconds=save_seconds,
        published=published,
        pruned_versions=pruned,
        write_seconds=write_seconds,
        superseded=superseded,
        handle=handle,
    )


def _prepare(
    chosen: list[tuple[str, torch.Tensor]],
    layout: TrainingLayout,
    rank: int,
    *,
    num_threads: int | None = None,
    reuse: Mapping[str, torch.Tensor] | None = None,
) -> _Prepared:
    """``reuse``: memory to copy a tensor into instead of fresh memory, by name, where its dtype
    and shape fit (the delta encoder's spare base, ``DeltaEncoder.take_spare``)."""
    # Copy: the next optimizer step updates parameters in place while the writer thread runs.
    into = None
    if reuse:
        into = [_fits(reuse.get(name), tensor) for name, tensor in chosen]
    copies = copy_tensors([tensor for _, tensor in chosen], num_threads=num_threads, into=into)
    return _Prepared(
        coords=layout.coords(rank),
        tensors={name: copy for (name, _), copy in zip(chosen, copies, strict=True)},
        specs={name: layout.spec_for(name) for name, _ in chosen},
    )


def _fits(target: torch.Tensor | None, tensor: torch.Tensor) -> torch.Tensor | None:
    if target is None or target.dtype != tensor.dtype or target.shape != tensor.shape:
        return None
    return target if target.is_contiguous() else None


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
