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
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mindspeed_rl.weights.export import ExportResult
from mindspeed_rl.weights.layout import PartitionSpec, TrainingLayout
from mindspeed_rl.weights.manifest import SnapshotInfo
from mindspeed_rl.weights.memory_snapshot import MemoryShard, MemorySnapshot, memory_shard
from mindspeed_rl.weights.store import check_run_id
from mindspeed_rl.weights.transport import memory_path

logger = logging.getLogger(__name__)


def select_tensors(
    version: int, named_tensors: Iterable[tuple[str, torch.Tensor]], layout: TrainingLayout, rank: int
) -> tuple[list[tuple[str, torch.Tensor]], int]:
    """The tensors rank ``rank`` exports (replicas are written by coordinate 0 only, as in
    ``SnapshotWriter``) and how many were skipped as replicas."""
    coords = layout.coords(rank)
    chosen: list[tuple[str, torch.Tensor]] = []
    seen: set[str] = set()
    skipped = 0
    for name, tensor in named_tensors:
        if name in seen:
            raise ValueError(f"tensor {name!r} was given twice for snapshot v{version}; names must be unique")
        seen.add(name)
        if tensor.device.type != "cpu":
            raise ValueError(f"tensor {name!r} is on {tensor.device}; move it to CPU before export")
        spec: PartitionSpec = layout.spec_for(name)
        if not layout.writes(spec, coords):
            skipped += 1
            continue
        chosen.append((name, tensor))
    return chosen, skipped


class SnapshotBoard:
    """Collects the shards of one snapshot from several TU rank processes (a Ray actor, named per
    run): the rank whose shard completes a version gets the whole snapshot and announces it.
    Keeps references only to versions not yet complete and to the newest ``keep_last``."""

    def __init__(self, world_size: int, keep_last: int) -> None:
        self.world_size = world_size
        self.keep_last = keep_last
        self._pending: dict[int, dict[int, MemoryShard]] = {}
        self._complete: OrderedDict[int, MemorySnapshot] = OrderedDict()

    def add(
        self, version: int, run_id: str, layout: dict[str, Any], shard: MemoryShard
    ) -> MemorySnapshot | None:
        parts = self._pending.setdefault(version, {})
        parts[shard.shard.rank] = shard
        if len(parts) < self.world_size:
            return None
        del self._pending[version]
        snapshot = MemorySnapshot(
            version=version,
            run_id=run_id,
            kind="training",
            layout=layout,
            shards=tuple(parts[r] for r in sorted(parts)),
            medium="object_store",
        )
        self._complete[version] = snapshot
        while len(self._complete) > self.keep_last:
            self._complete.popitem(last=False)
        # A version some rank superseded never completes: drop what older ones hold.
        for stale in [v for v in self._pending if v < version]:
            del self._pending[stale]
        return snapshot


@dataclass(slots=True, eq=False)
class _Queued:
    version: int
    rank: int
    layout: TrainingLayout
    shard: MemoryShard | None
    skipped: int
    prepare_seconds: float
    started: float
    future: Future[ExportResult]


class ObjectStoreExporter:
    """``SnapshotWriter``'s interface (``export`` / ``wait`` / ``close`` / ``num_superseded``)
    over Ray's object store; ``board`` is the ``SnapshotBoard`` handle when the TU has several
    ranks (None: one rank, it publishes alone)."""

    def __init__(self, *, keep_last: int = 2, run_id: str | None = None, board: Any = None) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last}: keep at least the newest snapshot (keep_last >= 1)")
        self.keep_last = keep_last
        self.run_id = check_run_id(run_id) if run_id is not None else uuid.uuid4().hex[:16]
        self.board = board
        self.num_superseded = 0
        self._held: OrderedDict[int, MemoryShard] = OrderedDict()
        self._bytes_put = 0
        self._peak_bytes = 0
        self._freed_versions = 0
        self._cond = threading.Condition()
        self._queue: list[_Queued] = []
        self._submitted: list[Future[ExportResult]] = []
        self._last_version: dict[int, int] = {}
        self._closed = False
        self._export_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="object-store-publisher", daemon=True)
        self._thread.start()

    def export(
        self,
        version: int,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        layout: TrainingLayout,
        rank: int = 0,
    ) -> Future[ExportResult]:
        import ray

        if version < 0:
            raise ValueError(f"snapshot version {version} is negative; use the trainer step (>= 0)")
        with self._export_lock:
            last = self._last_version.get(rank)
            if last is not None and version <= last:
                raise ValueError(
                    f"snapshot v{version} of rank {rank} after v{last}: policy versions must increase, "
                    f"export version {last + 1} or later"
                )
            started = time.perf_counter()
            chosen, skipped = select_tensors(version, named_tensors, layout, rank)
            self._supersede_queued(rank)
            shard = memory_shard(rank, layout.coords(rank), chosen, layout, ray.put)
            del chosen
            queued = _Queued(
                version=version,
                rank=rank,
                layout=layout,
                shard=shard,
                skipped=skipped,
                prepare_seconds=time.perf_counter() - started,
                started=started,
                future=Future(),
            )
            with self._cond:
                if self._closed:
                    raise RuntimeError("ObjectStoreExporter.export after close(); create a new exporter")
                self._last_version[rank] = version
                self._hold(version, shard)
                self._queue.append(queued)
                self._submitted = [f for f in self._submitted if not f.done()] + [queued.future]
                self._cond.notify_all()
        return queued.future

    def wait(self, timeout: float | None = None) -> list[ExportResult]:
        with self._cond:
            pending, self._submitted = self._submitted, []
        return [f.result(timeout=timeout) for f in pending]

    def close(self) -> None:
        try:
            self.wait()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._thread.join()

    def store_stats(self) -> dict[str, int]:
        """For summary.json: what this rank holds in the object store now and at most."""
        with self._cond:
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
        with self._cond:
            self._freed_versions += len(self._held)
            self._held.clear()

    def _hold(self, version: int, shard: MemoryShard) -> None:
        self._held[version] = shard
        self._bytes_put += shard.shard.nbytes
        self._peak_bytes = max(self._peak_bytes, sum(s.shard.nbytes for s in self._held.values()))
        while len(self._held) > self.keep_last:
            self._held.popitem(last=False)
            self._freed_versions += 1

    def _supersede_queued(self, rank: int) -> None:
        with self._cond:
            older = [q for q in self._queue if q.rank == rank]
            self._queue = [q for q in self._queue if q not in older]
            self.num_superseded += len(older)
            for q in older:
                # The newer export replaces it: nobody else holds this reference yet, so dropping it frees the object.
                if self._held.get(q.version) is q.shard:
                    del self._held[q.version]
                    self._freed_versions += 1
        for q in older:
            q.shard = None
            logger.info("snapshot v%d of rank %d superseded by a newer export while queued", q.version, rank)
            q.future.set_result(_result(q, published=None, superseded=True))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                queued = self._queue.pop(0)
            try:
                result = self._publish(queued)
            except Exception as err:  # handed to the caller through the future
                queued.future.set_exception(err)
            else:
                queued.future.set_result(result)
            finally:
                queued.shard = None

    def _publish(self, q: _Queued) -> ExportResult:
        import ray

        assert q.shard is not None
        layout = q.layout.to_json()
        if q.layout.world_size == 1:
            snapshot: MemorySnapshot | None = MemorySnapshot(
                version=q.version,
                run_id=self.run_id,
                kind="training",
                layout=layout,
                shards=(q.shard,),
                medium="object_store",
            )
        else:
            if self.board is None:  # every rank of one TU shares the run id: they find one board
                from mindspeed_rl.weights.endpoints import board_for

                self.board = board_for(self.run_id, q.layout.world_size, self.keep_last)
            snapshot = ray.get(self.board.add.remote(q.version, self.run_id, layout, q.shard))
        return _result(q, published=snapshot, superseded=False)


def _result(q: _Queued, *, published: MemorySnapshot | None, superseded: bool) -> ExportResult:
    info = None if published is None else SnapshotInfo(version=q.version, path=Path(memory_path(q.version)))
    nbytes = 0 if q.shard is None else q.shard.shard.nbytes
    return ExportResult(
        version=q.version,
        rank=q.rank,
        num_tensors=0 if q.shard is None else len(q.shard.entries),
        num_replicas_skipped=q.skipped,
        bytes_written=0 if superseded else nbytes,
        prepare_seconds=q.prepare_seconds,
        save_seconds=0.0 if superseded else time.perf_counter() - q.started,
        published=info,
        pruned_versions=(),
        write_seconds=0.0,
        superseded=superseded,
        handle=published,
    )
