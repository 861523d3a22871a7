"""The GU's end of ``weight_transport: collective`` (see collective.py): receive every TU rank's
buckets on the GU's one process group, convert per bucket, hand the result to the actors.

Per version: the headers of ranks 0..R-1, then bucket k of every rank that has one, for k = 0, 1,
...; after each round the conversion groups (a tensor's TP/EP pieces, a fused tensor's parts)
whose pieces have all arrived are converted with the file converter's plan (``streaming_merge``)
and put into the object store as one part (on a digest thread, while the next round is
received); their pieces are dropped. Host memory holds the buckets of two rounds plus the pieces
of groups still waiting for another rank's bucket, not the model. The actors then load the parts from the GU node's shared memory (zero-copy, as for
object_store).

A conversion error (a defective snapshot) rejects that version but the remaining buckets are
still received, so the stream stays in step for the next one; a receive error (the TU died)
ends the receiver and fails every wait on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mindspeed_rl.weights.collective import (
    BucketPool,
    ChannelAddress,
    Header,
    aligned,
    bucket_device,
    join_group,
    recv_bucket,
    recv_buckets,
    recv_header,
)
from mindspeed_rl.weights.hostcopy import Arena
from mindspeed_rl.weights.layout import InferenceLayout
from mindspeed_rl.weights.manifest import ShardEntry, SnapshotError, TensorEntry
from mindspeed_rl.weights.memory_snapshot import (
    MemoryShard,
    MemorySnapshot,
    as_tensor,
    entry_for,
    host_array,
    shard_key,
)
from mindspeed_rl.weights.memory_snapshot import (
    collect_rank as _collect,
)
from mindspeed_rl.weights.merge import NameMap

if TYPE_CHECKING:
    from mindspeed_rl.weights.delta_collective import CollectiveDeltaApplier

logger = logging.getLogger(__name__)


class CollectiveReceiver:
    """Runs on its own thread in the GU process (``start``); results go to ``received``."""

    def __init__(
        self,
        address: ChannelAddress,
        store: Any,
        layout: InferenceLayout,
        received: ReceivedSnapshots,
        put: Callable[[Any], Any],
        delta: CollectiveDeltaApplier | None = None,
    ) -> None:
        self.address = address
        self.delta = delta
        """``weight_delta`` auto / on: the host copies deltas are applied to (made at the first
        delta header when not given)."""
        self.layout = layout
        self.received = received
        self._store = store  # the master: kept alive as long as the group
        self._put = put
        self.group: Any = None
        self._device = bucket_device(address.backend)
        # gloo receives into host memory; NCCL / HCCL into the device bind_device names, which
        # the GU learns once its first generation actor is up (the GU itself asks Ray for none).
        self._device_bound = threading.Event()
        if self._device == "cpu":
            self._device_bound.set()
        self.bytes_received = 0
        self._arena = Arena()  # the merged tensors of one round, reused by every round and version
        self._buckets = BucketPool()  # received buckets, reused once every piece in them is converted
        self._thread = threading.Thread(target=self._run, name=f"weights-recv-gu{address.gu_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def bind_device(self, index: int) -> None:
        """NCCL / HCCL: receive on device ``index`` of this process (no effect on gloo)."""
        if self._device_bound.is_set():
            return
        self._device = f"{self._device}:{index}"
        self._device_bound.set()

    def _run(self) -> None:
        try:
            self._device_bound.wait()
            _set_thread_device(self._device)  # NCCL / HCCL pick the thread's current device
            self.group = join_group(self.address, self.address.receiver_rank, store=self._store)
            while True:
                self._receive_version()
        except Exception as err:  # the TU went away (end of run, or it died): no more versions
            logger.warning("GU %d: weights channel closed (%s)", self.address.gu_id, err)
            self.received.fail(f"{type(err).__name__}: {err}")

    def _receive_version(self) -> None:
        senders = self.address.world_size - 1
        headers = [recv_header(self.group, r, self._device) for r in range(senders)]
        if any(h.delta for h in headers):
            if self.delta is None:
                from mindspeed_rl.weights.delta_collective import CollectiveDeltaApplier

                self.delta = CollectiveDeltaApplier(self.address.gu_id, self._put)
            self.received.add(*self.delta.receive(self.group, headers, self._device))
            return
        version = headers[0].version
        if any(h.version != version for h in headers):
            # Ranks send in version order, each newest-first after supersedes: they can disagree
            # only if one rank dropped a version the others sent; drain and reject.
            reason = f"TU ranks sent versions {[h.version for h in headers]} together"
            self._drain(headers)
            self.received.add(max(h.version for h in headers), reason)
            return
        try:
            snapshot = self._receive_and_convert(headers)
        except SnapshotError as err:
            logger.error("GU %d: collective snapshot v%d rejected: %s", self.address.gu_id, version, err)
            self.received.add(version, str(err))
            return
        self.received.add(version, snapshot)

    def _drain(self, headers: list[Header]) -> None:
        rounds = max(len(h.buckets) for h in headers)
        for k in range(rounds):
            for r, h in enumerate(headers):
                if k < len(h.buckets):
                    recv_bucket(self.group, r, h.buckets[k][2], self._device)

    def _receive_and_convert(self, headers: list[Header]) -> MemorySnapshot:
        """Receive round k + 1 while round k is converted and put (one digest thread): the socket
        copy and the object-store copy overlap, and host memory holds two rounds of buckets."""
        digest = _Digest(headers, self.layout, self._put, self._arena, self._buckets)
        rounds = max(len(h.buckets) for h in headers)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-digest") as pool:
            previous: Future[None] | None = None
            for k in range(rounds):
                sending = [h for h in headers if k < len(h.buckets)]
                sources = [(r, h.buckets[k][2]) for r, h in enumerate(headers) if k < len(h.buckets)]
                buckets = recv_buckets(self.group, sources, self._device, self._buckets)
                arrived = list(zip(sending, buckets, strict=True))
                del buckets
                self.bytes_received += sum(n for _, n in sources)
                if previous is not None:
                    previous.result()  # at most one round digesting while the next is received
                previous = pool.submit(digest.round, k, arrived)
                del arrived
            if previous is not None:
                previous.result()
        return digest.finish()


def _set_thread_device(device: str) -> None:
    """Make ``device`` this thread's current one (CUDA / NPU runtimes keep it per host thread)."""
    import torch

    kind, _, index = device.partition(":")
    if kind == "cuda":  # NOT RUN on this host
        torch.cuda.set_device(int(index))
    elif kind == "npu":  # NOT RUN on this host
        import torch_npu  # noqa: F401  (registers torch.npu)

        torch.npu.set_device(int(index))  # type: ignore[attr-defined]


class _Digest:
    """One version's conversion, fed a round of buckets at a time (on the digest thread): the
    groups whose pieces are all in are converted and put in the object store as one part. An
    error is kept (the remaining rounds are still received, to keep the stream in step) and
    raised by ``finish``."""

    def __init__(
        self,
        headers: list[Header],
        layout: InferenceLayout,
        put: Callable[[Any], Any],
        arena: Arena,
        buckets: BucketPool | None = None,
    ) -> None:
        from mindspeed_rl.weights.convert import is_identity
        from mindspeed_rl.weights.streaming_merge import plan_conversion

        h0 = headers[0]
        self.version, self.run_id = h0.version, h0.run_id
        self.layout = layout
        self._put = put
        self._arena = arena
        source = MemorySnapshot(
            version=h0.version, run_id=h0.run_id, kind="training", layout=h0.layout,
            shards=tuple(MemoryShard(shard=h.shard, entries=h.entries, parts=(), part_sizes=()) for h in headers),
            medium="collective",
        )  # fmt: skip
        manifest = source.manifest()
        self.error: SnapshotError | None = None
        self.identity = False
        self.pending: list[Any] = []
        self.plan: Any = None
        try:
            self.identity = is_identity(manifest, layout, NameMap())
            if not self.identity:
                self.plan = plan_conversion(manifest, layout)
                self.pending = list(self.plan.groups)
        except SnapshotError as err:
            self.error = err
        self.key = shard_key(0)
        self.entries: list[TensorEntry] = []
        self.parts: list[Any] = []
        self.sizes: list[int] = []
        self.available: dict[tuple[str, str], torch.Tensor] = {}
        self._buckets = buckets
        self._held: list[tuple[np.ndarray, list[tuple[str, str]]]] = []
        """Received buckets not yet given back, with the keys of the pieces still read from them."""

    def round(self, k: int, arrived_buckets: list[tuple[Header, np.ndarray]]) -> None:
        from mindspeed_rl.weights.streaming_merge import convert_group_in_memory, group_keys

        if self.error is not None:
            return  # the version is rejected: the buckets were received only to stay in step
        arrived: list[tuple[str, torch.Tensor]] = []
        for h, bucket in arrived_buckets:
            first, end, _ = h.buckets[k]
            keys = []
            for entry, tensor in _unpack(bucket, h.entries[first:end]):
                self.available[(entry.shard_file, entry.name)] = tensor
                arrived.append((entry.name, tensor))
                keys.append((entry.shard_file, entry.name))
            self._held.append((bucket, keys))
        out: list[tuple[str, torch.Tensor]] = []
        self._arena.reset()  # the previous round's merged tensors were put (copied) and dropped
        if self.identity:
            out, self.available = arrived, {}
        else:
            ready = [g for g in self.pending if all(k_ in self.available for k_ in group_keys(g))]
            for group in ready:
                try:
                    convert_group_in_memory(
                        group,
                        self.plan,
                        self.available,
                        self.layout,
                        _collect(out, 0),
                        alloc=self._arena.take,
                    )
                except (SnapshotError, ValueError) as err:
                    self.error = SnapshotError(str(err))
                    return
                for k_ in group_keys(group):
                    del self.available[k_]
                self.pending.remove(group)
        if out:
            self.entries.extend(entry_for(n, t, key=self.key, layout=self.layout) for n, t in out)
            self.parts.append(self._put([host_array(t) for _, t in out]))
            self.sizes.append(len(out))
        del out, arrived
        self._give_back_done()

    def _give_back_done(self) -> None:
        """Buckets none of whose pieces is still waiting for its group go back to the pool: what
        was read from them has been merged into the arena or put (copied) by now."""
        if self._buckets is None:
            return
        done = [b for b, keys in self._held if not any(k in self.available for k in keys)]
        self._held = [(b, keys) for b, keys in self._held if any(k in self.available for k in keys)]
        self._buckets.give_back(done)

    def finish(self) -> MemorySnapshot:
        if self.error is not None:
            raise self.error
        if self.pending:
            raise SnapshotError(
                f"v{self.version}: {len(self.pending)} conversion groups never got all their pieces"
            )
        shard = ShardEntry(
            file=self.key, rank=0, coords=self.layout.coords(0), nbytes=sum(e.nbytes for e in self.entries)
        )
        return MemorySnapshot(
            version=self.version, run_id=self.run_id, kind="inference", layout=self.layout.to_json(),
            shards=(
                MemoryShard(
                    shard=shard, entries=tuple(self.entries), parts=tuple(self.parts), part_sizes=tuple(self.sizes)
                ),
            ),
            medium="collective",
        )  # fmt: skip


def _unpack(bucket: np.ndarray, entries: tuple[TensorEntry, ...]) -> list[tuple[TensorEntry, torch.Tensor]]:
    """Zero-copy tensors over one received bucket (whole tensors back to back)."""
    out = []
    at = 0
    for entry in entries:
        if at + entry.nbytes > bucket.nbytes:
            raise SnapshotError(f"{entry.name}: bucket of {bucket.nbytes} bytes ends inside it")
        view = bucket[at : at + entry.nbytes]
        out.append((entry, as_tensor(view, entry)))
        at += aligned(entry.nbytes)
    if at != bucket.nbytes:
        raise SnapshotError(f"bucket of {bucket.nbytes} bytes holds {at} bytes of tensors")
    return out


class ReceivedSnapshots:
    """A GU's received versions (newest ``keep_last``), for ``convert_snapshot`` to wait on."""

    def __init__(self, keep_last: int = 2) -> None:
        self.keep_last = keep_last
        self._cond = threading.Condition()
        self._done: OrderedDict[int, MemorySnapshot | str] = OrderedDict()
        self.failed: str | None = None

    def add(self, version: int, result: MemorySnapshot | str) -> None:
        with self._cond:
            self._done[version] = result
            while len(self._done) > self.keep_last:
                self._done.popitem(last=False)
            self._cond.notify_all()

    def fail(self, why: str) -> None:
        with self._cond:
            self.failed = why
            self._cond.notify_all()

    def wait_for(self, version: int, timeout: float) -> MemorySnapshot | str:
        """The received snapshot of ``version``, or why there is none (a reason string)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if version in self._done:
                    return self._done[version]
                if any(v > version for v in self._done):
                    return f"v{version} was superseded before it arrived"
                if self.failed is not None:
                    return f"the weights channel failed: {self.failed}"
                left = deadline - time.monotonic()
                if left <= 0:
                    return f"v{version} did not arrive within {timeout:.0f} s"
                self._cond.wait(left)
