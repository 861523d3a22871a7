"""``weight_transport: object_store``: the Training Unit's export into Ray's object store.

::

    training step t ──► export(t, named_tensors, layout, rank)
                           │  ray.put(host arrays of this rank's tensors)   the one copy, on the trainer's thread
                           ▼
              one-slot queue per rank ──► [publisher thread]
                           │  one rank: MemorySnapshot(v_t) at once
                           │  several ranks: SnapshotBoard.add(v_t, shard) — the last rank in gets the whole
                           ▼
                  ExportResult(handle=MemorySnapshot) ──► TU announces it to the CU (SnapshotInfo.handle)
                           │
                           ▼  retention: this rank keeps the refs of its newest ``keep_last`` versions

The contract is ``SnapshotWriter``'s (export.py): versions increase per rank, a version is
announced only once every rank's shard is in, at most one publish per rank is in flight and a
newer export supersedes a queued one (its object reference is dropped at once, which frees it).

Object lifetime: Ray frees an object when no process holds a reference to it any longer. The
exporter holds its newest ``keep_last`` versions (>= 2, so the one actors are loading survives
the next publish), the Control Unit and each GU hold only the newest announced one, an actor only
while it loads. ``store_stats`` (in ``summary.json``) reports the bytes held and their peak
(``keep_last + 1`` versions: a new version is put before the oldest is let go).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from mindspeed_rl.weights.export import ExportResult, export_result
from mindspeed_rl.weights.export_queue import ExportQueue, Pending
from mindspeed_rl.weights.layout import TrainingLayout
from mindspeed_rl.weights.manifest import SnapshotInfo
from mindspeed_rl.weights.memory_snapshot import MemoryShard, MemorySnapshot, memory_shard
from mindspeed_rl.weights.store import check_run_id
from mindspeed_rl.weights.transport import memory_path

logger = logging.getLogger(__name__)


S = TypeVar("S")


class RankAssembler(Generic[S]):
    """A version's shards, by rank, until every rank's is in (what a run's board does for the
    object store's snapshots and its delta links). A version some rank superseded never
    completes: a newer complete one drops what the older ones hold."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._pending: dict[int, dict[int, S]] = {}

    def add(self, version: int, rank: int, shard: S) -> tuple[S, ...] | None:
        """Every rank's shard in rank order once ``shard`` completes ``version``; None before."""
        parts = self._pending.setdefault(version, {})
        parts[rank] = shard
        if len(parts) < self.world_size:
            return None
        del self._pending[version]
        for stale in [v for v in self._pending if v < version]:
            del self._pending[stale]
        return tuple(parts[r] for r in sorted(parts))


class SnapshotBoard:
    """Collects the shards of one snapshot from several TU rank processes (a Ray actor, named per
    run): the rank whose shard completes a version gets the whole snapshot and announces it.
    Keeps references only to versions not yet complete and to the newest ``keep_last``."""

    def __init__(self, world_size: int, keep_last: int) -> None:
        self.world_size = world_size
        self.keep_last = keep_last
        self._shards: RankAssembler[MemoryShard] = RankAssembler(world_size)
        self._complete: OrderedDict[int, MemorySnapshot] = OrderedDict()

    def add(
        self, version: int, run_id: str, layout: dict[str, Any], shard: MemoryShard
    ) -> MemorySnapshot | None:
        shards = self._shards.add(version, shard.shard.rank, shard)
        if shards is None:
            return None
        snapshot = MemorySnapshot(
            version=version,
            run_id=run_id,
            kind="training",
            layout=layout,
            shards=shards,
            medium="object_store",
        )
        self._complete[version] = snapshot
        while len(self._complete) > self.keep_last:
            self._complete.popitem(last=False)
        return snapshot


class ObjectStoreExporter(ExportQueue[MemoryShard]):
    """``SnapshotWriter``'s interface (``export`` / ``wait`` / ``close`` / ``num_superseded``)
    over Ray's object store; ``board`` is the ``SnapshotBoard`` handle when the TU has several
    ranks (None: one rank, it publishes alone)."""

    def __init__(self, *, keep_last: int = 2, run_id: str | None = None, board: Any = None) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last}: keep at least the newest snapshot (keep_last >= 1)")
        self.keep_last = keep_last
        self.run_id = check_run_id(run_id) if run_id is not None else uuid.uuid4().hex[:16]
        self.board = board
        self._held: OrderedDict[int, MemoryShard] = OrderedDict()
        self._held_lock = threading.Lock()
        self._bytes_put = 0
        self._peak_bytes = 0
        self._freed_versions = 0
        super().__init__(thread_name="object-store-publisher")

    def store_stats(self) -> dict[str, int]:
        """For summary.json: what this rank holds in the object store now and at most."""
        with self._held_lock:
            live = sum(s.shard.nbytes for s in self._held.values())
            return {
                "object_store_bytes_held": live,
                "object_store_peak_bytes_held": self._peak_bytes,
                "object_store_bytes_put": self._bytes_put,
                "object_store_versions_released": self._freed_versions,
                "object_store_versions_held": len(self._held),
            }

    def release_all(self) -> None:
        """Drop every reference this exporter holds (end of run)."""
        with self._held_lock:
            self._freed_versions += len(self._held)
            self._held.clear()

    def _payload(
        self, version: int, chosen: list[tuple[str, torch.Tensor]], layout: TrainingLayout, rank: int
    ) -> MemoryShard:
        import ray

        shard = memory_shard(rank, layout.coords(rank), chosen, layout, ray.put)
        with self._held_lock:  # retention: the newest keep_last versions stay referenced here
            self._held[version] = shard
            self._bytes_put += shard.shard.nbytes
            self._peak_bytes = max(self._peak_bytes, sum(s.shard.nbytes for s in self._held.values()))
            while len(self._held) > self.keep_last:
                self._held.popitem(last=False)
                self._freed_versions += 1
        return shard

    def _release(self, pending: Pending[MemoryShard]) -> None:
        # Nobody else holds a queued version's reference yet, so dropping it frees the object.
        with self._held_lock:
            if self._held.get(pending.version) is pending.payload:
                del self._held[pending.version]
                self._freed_versions += 1

    def _superseded(self, pending: Pending[MemoryShard]) -> ExportResult:
        return export_result(pending, bytes_written=0, save_seconds=0.0, published=None, superseded=True)

    def _publish(self, pending: Pending[MemoryShard]) -> ExportResult:
        import ray

        shard = pending.payload
        assert shard is not None
        layout = pending.layout.to_json()
        if pending.layout.world_size == 1:
            snapshot: MemorySnapshot | None = MemorySnapshot(
                version=pending.version,
                run_id=self.run_id,
                kind="training",
                layout=layout,
                shards=(shard,),
                medium="object_store",
            )
        else:
            if self.board is None:  # every rank of one TU shares the run id: they find one board
                self.board = board_for(self.run_id, pending.layout.world_size, self.keep_last)
            snapshot = ray.get(self.board.add.remote(pending.version, self.run_id, layout, shard))
        return memory_result(pending, snapshot, shard.shard.nbytes)


def board_for(run_id: str, world_size: int, keep_last: int) -> Any:
    """The run's ``SnapshotBoard`` actor (created by the first rank to ask, found by the others)."""
    import ray

    return (
        ray.remote(SnapshotBoard)
        .options(name=f"snapshot-board-{run_id}", get_if_exists=True, num_cpus=0)
        .remote(world_size, keep_last)
    )


def memory_result(pending: Pending[Any], snapshot: MemorySnapshot | None, nbytes: int) -> ExportResult:
    """A published memory export's result (object_store, collective); ``snapshot`` None: other
    ranks' shards of this version are not all in yet, so nothing is announced."""
    info = (
        None
        if snapshot is None
        else SnapshotInfo(version=pending.version, path=Path(memory_path(pending.version)))
    )
    return export_result(
        pending,
        bytes_written=nbytes,
        save_seconds=time.perf_counter() - pending.started,
        published=info,
        handle=snapshot,
    )
