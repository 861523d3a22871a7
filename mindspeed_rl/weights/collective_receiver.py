"""The GU's end of ``weight_transport: collective`` (see collective.py): receive every TU rank's
buckets on the GU's one process group, convert per bucket, hand the result to the actors.

Per version: the headers of ranks 0..R-1, then bucket k of every rank that has one, for k = 0, 1,
...; after each round the conversion groups (a tensor's TP/EP pieces, a fused tensor's parts)
whose pieces have all arrived are converted with the file converter's plan (``streaming_merge``)
and put into the object store as one part; their pieces are dropped. Host memory holds the
buckets of one round plus the pieces of groups still waiting for another rank's bucket, not the
model. The actors then load the parts from the GU node's shared memory (zero-copy, as for
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
from typing import Any

import numpy as np
import torch

from mindspeed_rl.weights.collective import (
    ChannelAddress,
    Header,
    aligned,
    bucket_device,
    join_group,
    recv_bucket,
    recv_header,
)
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
    ) -> None:
        self.address = address
        self.layout = layout
        self.received = received
        self._store = store  # the master: kept alive as long as the group
        self._put = put
        self.group: Any = None
        self._device = bucket_device(address.backend)
        self.bytes_received = 0
        self._thread = threading.Thread(target=self._run, name=f"weights-recv-gu{address.gu_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self.group = join_group(self.address, self.address.receiver_rank, store=self._store)
            while True:
                self._receive_version()
        except Exception as err:  # the TU went away (end of run, or it died): no more versions
            logger.warning("GU %d: weights channel closed (%s)", self.address.gu_id, err)
            self.received.fail(f"{type(err).__name__}: {err}")

    def _receive_version(self) -> None:
        senders = self.address.world_size - 1
        headers = [recv_header(self.group, r, self._device) for r in range(senders)]
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
        from mindspeed_rl.weights.convert import is_identity
        from mindspeed_rl.weights.streaming_merge import convert_group_in_memory, group_keys, plan_conversion

        h0 = headers[0]
        source = MemorySnapshot(
            version=h0.version, run_id=h0.run_id, kind="training", layout=h0.layout,
            shards=tuple(MemoryShard(shard=h.shard, entries=h.entries, parts=(), part_sizes=()) for h in headers),
            medium="collective",
        )  # fmt: skip
        manifest = source.manifest()
        error: SnapshotError | None = None
        identity = False
        pending: list[Any] = []
        plan: Any = None
        try:
            identity = is_identity(manifest, self.layout, NameMap())
            if not identity:
                plan = plan_conversion(manifest, self.layout)
                pending = list(plan.groups)
        except SnapshotError as err:
            error = err
        key = shard_key(0)
        entries: list[TensorEntry] = []
        parts: list[Any] = []
        sizes: list[int] = []
        available: dict[tuple[str, str], torch.Tensor] = {}
        rounds = max(len(h.buckets) for h in headers)
        for k in range(rounds):
            arrived: list[tuple[str, torch.Tensor]] = []
            for r, h in enumerate(headers):
                if k >= len(h.buckets):
                    continue
                first, end, nbytes = h.buckets[k]
                bucket = recv_bucket(self.group, r, nbytes, self._device)
                self.bytes_received += nbytes
                if error is None:
                    for entry, tensor in _unpack(bucket, h.entries[first:end]):
                        available[(entry.shard_file, entry.name)] = tensor
                        arrived.append((entry.name, tensor))
            if error is not None:
                continue  # keep the stream in step; the version is rejected below
            out: list[tuple[str, torch.Tensor]] = []
            if identity:
                out, available = arrived, {}
            else:
                ready = [g for g in pending if all(k_ in available for k_ in group_keys(g))]
                for group in ready:
                    try:
                        convert_group_in_memory(group, plan, available, self.layout, _collect(out, 0))
                    except (SnapshotError, ValueError) as err:
                        error = SnapshotError(str(err))
                        break
                    for k_ in group_keys(group):
                        del available[k_]
                    pending.remove(group)
            if out and error is None:
                entries.extend(entry_for(n, t, key=key, layout=self.layout) for n, t in out)
                parts.append(self._put([host_array(t) for _, t in out]))
                sizes.append(len(out))
        if error is not None:
            raise error
        if pending:
            raise SnapshotError(f"v{h0.version}: {len(pending)} conversion groups never got all their pieces")
        shard = ShardEntry(
            file=key, rank=0, coords=self.layout.coords(0), nbytes=sum(e.nbytes for e in entries)
        )
        return MemorySnapshot(
            version=h0.version, run_id=h0.run_id, kind="inference", layout=self.layout.to_json(),
            shards=(MemoryShard(shard=shard, entries=tuple(entries), parts=tuple(parts), part_sizes=tuple(sizes)),),
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
