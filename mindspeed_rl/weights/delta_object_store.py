"""Delta sync on ``weight_transport: object_store`` (``async_config.weight_delta: auto | on``).

::

    TU rank r (DeltaObjectStoreExporter, publisher thread)   GU g (ObjectStoreGu with a DeltaApplier)
    ──────────────────────────────────────────────────────   ──────────────────────────────────────────
    asks = board.full_requests()   (a GU asked for a full?)   per rank r: the links of r's chain after
    encode v against r's last encoded version                   the version r's copy holds (or from its
      (full: first, asked for, every delta_full_interval,       full, when it holds nothing / another
       auto over the threshold)                                 chain): ray.get, unpack, apply (xxh3
    ray.put(pack(refresh)) ─► DeltaLinkRef                      of every tensor; a mismatch names tensor
    chain = the links since r's last full (a full resets it)    and version, drops r's copy, asks)
    board.add(v, DeltaShard(chain)) ─► DeltaSnapshot once      ray.put the applied copies as today's
      every rank's shard is in (the handle the CU announces)     training MemorySnapshot: actors fetch it
                                                                 and convert it as with weight_delta off
                 ◄──── board.ask_full(gu_id) (a corrupt delta, a broken chain) ────

Why the chain travels in the handle: a GU converts only the newest announced version, so it may
have skipped some; each handle carries the references of its rank's links back to the last full
(at most ``delta_full_interval`` of them), which keeps them alive in the object store while any
holder of the handle (CU, GU) keeps it, and lets a GU that holds nothing (a restart) start from
that full: nothing is guessed, and no other channel is needed but for the ask. The ask goes to
the run's board, a named Ray actor (``delta-board-<run id>``), which also assembles the ranks'
shards as ``object_store``'s ``SnapshotBoard`` does.

Bytes: what the TU puts is the packed refresh (a delta: about twice the changed fraction of the
full bytes, see ``weights.delta``); the GU puts a full copy for its actors on its own node.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindspeed_rl.weights.delta import (
    BaseMismatch,
    DeltaEncoder,
    DeltaMismatch,
    DeltaReceiver,
    DeltaRefresh,
    DeltaStats,
)
from mindspeed_rl.weights.delta_wire import pack, unpack
from mindspeed_rl.weights.export import ExportResult, _prepare, _Prepared, export_result
from mindspeed_rl.weights.export_queue import ExportQueue, Pending
from mindspeed_rl.weights.layout import TrainingLayout
from mindspeed_rl.weights.manifest import ShardEntry, SnapshotError, SnapshotInfo
from mindspeed_rl.weights.memory_snapshot import MemorySnapshot, memory_shard, shard_key
from mindspeed_rl.weights.object_store import RankAssembler
from mindspeed_rl.weights.store import check_run_id
from mindspeed_rl.weights.transport import memory_path
from mindspeed_rl.weights.transports.base import DeltaSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeltaLinkRef:
    """One packed refresh (``delta_wire.pack``) of one rank, in the object store."""

    version: int
    base_version: int | None
    """None: a full refresh."""
    ref: Any
    """``ObjectRef`` of a uint8 array."""
    nbytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DeltaShard:
    shard: ShardEntry
    """rank and coordinates; ``nbytes``: this version's packed refresh."""
    chain: tuple[DeltaLinkRef, ...]
    """This rank's links from its last full (first) to this version (last)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeltaSnapshot:
    """The handle of a delta version (``SnapshotInfo.handle``): every rank's chain."""

    version: int
    run_id: str
    layout: dict[str, Any]
    shards: tuple[DeltaShard, ...]

    @property
    def nbytes(self) -> int:
        return sum(s.shard.nbytes for s in self.shards)


class DeltaBoard:
    """The run's board (a named Ray actor): assembles the ranks' shards of a version into a
    ``DeltaSnapshot`` (the last rank in gets it) and counts each GU's asks for a full."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._shards: RankAssembler[DeltaShard] = RankAssembler(world_size)
        self._asks: dict[int, int] = {}

    def add(
        self, version: int, run_id: str, layout: dict[str, Any], shard: DeltaShard
    ) -> DeltaSnapshot | None:
        shards = self._shards.add(version, shard.shard.rank, shard)
        if shards is None:
            return None
        return DeltaSnapshot(version=version, run_id=run_id, layout=layout, shards=shards)

    def ask_full(self, gu_id: int) -> int:
        self._asks[gu_id] = self._asks.get(gu_id, 0) + 1
        return self._asks[gu_id]

    def full_requests(self) -> dict[int, int]:
        return dict(self._asks)


def board_name(run_id: str) -> str:
    return f"delta-board-{run_id}"


def delta_board(run_id: str, world_size: int) -> Any:
    """The run's ``DeltaBoard`` (made by the first TU rank to ask, found by the others)."""
    import ray

    return (
        ray.remote(DeltaBoard)
        .options(name=board_name(run_id), get_if_exists=True, num_cpus=0)
        .remote(world_size)
    )


class DeltaObjectStoreExporter(ExportQueue[_Prepared]):
    """``SnapshotWriter``'s interface over Ray's object store, putting packed refreshes.

    The copy is made on the trainer's thread (as for ``shared_fs``: the next optimizer step
    changes the tensors); encoding happens on the publisher thread, in version order and only
    for exports that were not superseded, so a rank's encoder base is always its last link."""

    def __init__(
        self, *, settings: DeltaSettings, keep_last: int = 2, run_id: str | None = None, board: Any = None
    ) -> None:
        DeltaEncoder(settings.mode, full_interval=settings.full_interval)  # bad settings raise here
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last}: keep at least the newest snapshot (keep_last >= 1)")
        self.settings = settings
        self.keep_last = keep_last
        self.run_id = check_run_id(run_id) if run_id is not None else uuid.uuid4().hex[:16]
        self.board = board
        self._encoders: dict[int, DeltaEncoder] = {}
        self._chains: dict[int, list[DeltaLinkRef]] = {}
        self._honoured: dict[int, dict[int, int]] = {}
        self._held: OrderedDict[int, DeltaShard] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes_put = 0
        self.delta_stats = DeltaStats()
        super().__init__(thread_name="object-store-delta-publisher")

    def stats(self) -> dict[str, float]:
        """summary.json: the TU's delta totals and the bytes it put into the object store."""
        with self._lock:
            return {**self.delta_stats.as_summary(), "object_store_bytes_put": float(self._bytes_put)}

    def release_all(self) -> None:
        """Drop every reference this exporter holds (end of run); a later export starts full."""
        with self._lock:
            self._held.clear()
            self._chains.clear()
            self._encoders.clear()

    def _payload(self, version: int, chosen: list[Any], layout: TrainingLayout, rank: int) -> _Prepared:
        # Into the base the rank's encoder let go, where there is one (DeltaEncoder.take_spare).
        encoder = self._encoders.get(rank)
        return _prepare(chosen, layout, rank, reuse=None if encoder is None else encoder.take_spare(chosen))

    def _release(self, pending: Pending[_Prepared]) -> None:
        """A superseded copy is simply dropped (nothing was put yet)."""

    def _superseded(self, pending: Pending[_Prepared]) -> ExportResult:
        return export_result(pending, bytes_written=0, save_seconds=0.0, published=None, superseded=True)

    def _full_asked(self, rank: int) -> bool:
        import ray

        honoured = self._honoured.setdefault(rank, {})
        asked = False
        for gu_id, count in ray.get(self.board.full_requests.remote()).items():
            if count > honoured.get(gu_id, 0):
                honoured[gu_id] = count
                asked = True
        return asked

    def _publish(self, pending: Pending[_Prepared]) -> ExportResult:
        import ray

        prep = pending.payload
        assert prep is not None
        if self.board is None:  # every rank of one TU shares the run id: they find one board
            self.board = delta_board(self.run_id, pending.layout.world_size)
        encoder = self._encoders.setdefault(
            pending.rank, DeltaEncoder(self.settings.mode, full_interval=self.settings.full_interval)
        )
        base = None if self._full_asked(pending.rank) else encoder.base_version
        refresh = encoder.encode(pending.version, prep.tensors.items(), base, owned=True)
        self.delta_stats.record(refresh, 0.0)
        buffer = np.frombuffer(pack(refresh), dtype=np.uint8)
        link = DeltaLinkRef(
            version=refresh.version,
            base_version=refresh.base_version,
            ref=ray.put(buffer),
            nbytes=buffer.size,
        )
        chain = self._chains.setdefault(pending.rank, [])
        if refresh.is_full:
            chain.clear()  # the older links are let go with the handles that still name them
        chain.append(link)
        shard = DeltaShard(
            shard=ShardEntry(
                file=shard_key(pending.rank), rank=pending.rank, coords=prep.coords, nbytes=buffer.size
            ),
            chain=tuple(chain),
        )
        with self._lock:
            self._held[pending.version] = shard
            self._bytes_put += buffer.size
            while len(self._held) > self.keep_last:
                self._held.popitem(last=False)
        snapshot = ray.get(
            self.board.add.remote(pending.version, self.run_id, pending.layout.to_json(), shard)
        )
        info = (
            None
            if snapshot is None
            else SnapshotInfo(version=pending.version, path=Path(memory_path(pending.version)))
        )
        return export_result(
            pending,
            bytes_written=buffer.size,
            save_seconds=time.perf_counter() - pending.started,
            published=info,
            handle=snapshot,
        )


class _ChainBroken(SnapshotError):
    """The handle's chain does not lead from what a rank's copy holds to its version."""


class ObjectStoreDeltaApplier:
    """A GU's host copies (one ``DeltaReceiver`` per TU rank), advanced along each announced
    ``DeltaSnapshot``'s chains, then put as the training ``MemorySnapshot`` actors load."""

    def __init__(self, gu_id: int) -> None:
        self.gu_id = gu_id
        self.receivers: dict[int, DeltaReceiver] = {}
        self._lock = threading.Lock()
        self.stats = DeltaStats()
        self.last: dict[str, float] = {}

    def apply(self, handle: DeltaSnapshot) -> MemorySnapshot:
        with self._lock:
            return self._apply(handle)

    def _apply(self, handle: DeltaSnapshot) -> MemorySnapshot:
        import ray

        sent = applied = changed = total = 0
        encode_s = apply_s = 0.0
        try:
            for shard in handle.shards:
                receiver = self.receivers.setdefault(shard.shard.rank, DeltaReceiver())
                for refresh in self._links(handle.version, shard, receiver.base_version):
                    seconds = receiver.apply(refresh)
                    self.stats.record(refresh, seconds)
                    applied += 1
                    sent += refresh.nbytes
                    changed += refresh.changed_elements
                    total += refresh.total_elements
                    encode_s += refresh.encode_seconds
                    apply_s += seconds
        except (DeltaMismatch, BaseMismatch, _ChainBroken) as err:
            logger.error("GU %d: %s; asking the trainer for a full snapshot", self.gu_id, err)
            self.stats.resends += 1
            self.ask_full(handle.run_id)
            raise
        self.last = {
            "delta_bytes_sent": float(sent),
            "delta_changed_fraction": changed / max(total, 1),
            "delta_encode_seconds": encode_s,
            "delta_apply_seconds": apply_s,
            "delta_refreshes_applied": float(applied),
        }
        layout = TrainingLayout.from_json(handle.layout)
        # The copy into the object store: the receivers' copies change in place at the next apply.
        shards = tuple(
            memory_shard(
                shard.shard.rank,
                shard.shard.coords,
                self.receivers[shard.shard.rank].tensors().items(),
                layout,
                ray.put,
            )
            for shard in handle.shards
        )
        return MemorySnapshot(
            version=handle.version,
            run_id=handle.run_id,
            kind="training",
            layout=handle.layout,
            shards=shards,
            medium="object_store",
        )

    def ask_full(self, run_id: str) -> None:
        import ray

        ray.get(ray.get_actor(board_name(run_id)).ask_full.remote(self.gu_id))

    def _links(self, version: int, shard: DeltaShard, holds: int | None) -> list[DeltaRefresh]:
        """The refreshes to apply, oldest first: after the link of the held version, or from the
        chain's full when the copy holds nothing of this chain."""
        import ray

        chain = shard.chain
        if not chain or chain[-1].version != version:
            raise _ChainBroken(
                f"weight delta v{version}, rank {shard.shard.rank}: the handle's chain ends elsewhere"
            )
        if holds == version:
            return []
        versions = [link.version for link in chain]
        start = versions.index(holds) + 1 if holds in versions else 0
        if chain[start].base_version is not None and chain[start].base_version != holds:
            raise _ChainBroken(
                f"weight delta v{version}, rank {shard.shard.rank}: the chain starts at a delta on "
                f"v{chain[start].base_version}, this GU holds {'nothing' if holds is None else f'v{holds}'}"
            )
        out = []
        for link in chain[start:]:
            try:
                buffer = ray.get(link.ref)
            except Exception as err:  # a lost object: ray raises its own errors
                raise _ChainBroken(
                    f"weight delta v{version}, rank {shard.shard.rank}: v{link.version} cannot be fetched ({err})"
                ) from err
            refresh = unpack(np.asarray(buffer).tobytes())
            if refresh.version != link.version:
                raise _ChainBroken(f"a link announced as v{link.version} holds v{refresh.version}")
            out.append(refresh)
        return out
