"""Delta sync on ``weight_transport: collective`` (``async_config.weight_delta: auto | on``).

::

    TU rank r (DeltaCollectiveSender, publisher thread)     GU g (CollectiveReceiver + CollectiveDeltaApplier)
    ───────────────────────────────────────────────────     ──────────────────────────────────────────────────
    per live GU: recv its answer to r's last send  ◄──────  answer: the version r's copy now holds (-1: none)
      (nothing sent to it yet: it holds nothing)
    encode v once against r's last version (full: first,
      every delta_full_interval, auto over the threshold,
      or no GU holds that base); a GU holding something
      else gets the same version in full
    header (delta) ─► packed refresh in bucket_mb pieces ─► every rank's pieces received, unpacked, applied
                                                            to r's host copy (xxh3 of every tensor: a
                                                            mismatch names tensor + version, drops r's
                                                            copy, the version is rejected); answers sent;
                                                            the copies put as the training MemorySnapshot
                                                            actors fetch and convert (as object_store's)

The ask travels on the group itself, in the direction opposite to the weights: the GU answers
right after applying and the rank reads the answer at its next export, just before encoding,
so nothing else (a board, a file) is needed and a GU that joins later, restarts or failed a
checksum simply answers "nothing" and gets a full copy. The answer is posted without waiting
(a gloo or NCCL send returns at once; it completes when the rank reads it), so the GU never
waits on its trainer between two refreshes.

Backends: gloo runs here (tests, benchmarks). NCCL / HCCL move the same tensors through
``bucket_device``: written against torch 2.13's ``ProcessGroup.send`` / ``recv`` (device
tensors, one stream per peer) and NOT RUN on this host (no GPU / NPU); the packed refresh is
copied to the device and back, where an on-device encoder would avoid both copies.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from mindspeed_rl.weights.collective import (
    _TAG,
    ChannelAddress,
    ChannelSender,
    Header,
    bucket_device,
)
from mindspeed_rl.weights.delta import DeltaEncoder, DeltaReceiver, DeltaRefresh, DeltaStats
from mindspeed_rl.weights.delta_wire import pack, unpack
from mindspeed_rl.weights.export import ExportResult, _prepare, _Prepared
from mindspeed_rl.weights.export_queue import Pending
from mindspeed_rl.weights.layout import TrainingLayout
from mindspeed_rl.weights.manifest import ShardEntry, SnapshotError
from mindspeed_rl.weights.memory_snapshot import MemorySnapshot, entry_for, memory_shard, shard_key
from mindspeed_rl.weights.transports.base import DeltaSettings

logger = logging.getLogger(__name__)
NOTHING = -1
"""The answer of a GU that holds no copy of the rank's tensors (a full refresh is needed)."""
KEEP_METRICS = 4
"""Versions whose delta figures the GU keeps for its conversions to report."""


# ---- the wire ------------------------------------------------------------------------------------
def pieces(nbytes: int, bucket_bytes: int) -> tuple[tuple[int, int, int], ...]:
    """The header's bucket table for a packed refresh of ``nbytes``: pieces of at most
    ``bucket_bytes`` (at least one, so an empty buffer still has its place in the stream)."""
    step = max(1, bucket_bytes)
    sizes = [min(step, nbytes - at) for at in range(0, nbytes, step)] or [0]
    return tuple((0, 0, n) for n in sizes)


def send_refresh(group: Any, header: Header, buffer: np.ndarray, dst: int, device: str = "cpu") -> None:
    """Header length, header, then the buffer's pieces as the header's table cuts them."""
    body = np.frombuffer(header.dumps(), dtype=np.uint8).copy()
    tensors = [torch.tensor([body.nbytes], dtype=torch.int64), torch.from_numpy(body)]
    at = 0
    for _, _, n in header.buckets:
        tensors.append(torch.from_numpy(buffer[at : at + n]))
        at += n
    for tensor in tensors:
        group.send([tensor.to(device) if device != "cpu" else tensor], dst, _TAG).wait()


def recv_payloads(group: Any, headers: list[Header], device: str = "cpu") -> list[np.ndarray]:
    """Every rank's pieces, all receives posted before any is waited for (the ranks' sends flow
    side by side), each rank's into one host buffer."""
    out = [np.empty(sum(n for _, _, n in h.buckets), dtype=np.uint8) for h in headers]
    posted: list[tuple[Any, torch.Tensor, np.ndarray]] = []
    for src, (h, buffer) in enumerate(zip(headers, out, strict=True)):
        at = 0
        for _, _, n in h.buckets:
            view = buffer[at : at + n]
            target = (
                torch.from_numpy(view)
                if device == "cpu"
                else torch.empty(n, dtype=torch.uint8, device=device)
            )
            posted.append((group.recv([target], src, _TAG), target, view))
            at += n
    for work, target, view in posted:
        work.wait()
        if device != "cpu":  # NOT RUN on this host: received on the device, one copy to the host
            view[:] = target.cpu().numpy()
    return out


def post_answer(group: Any, dst: int, holds: int | None, device: str = "cpu") -> tuple[Any, torch.Tensor]:
    """The GU's answer to rank ``dst``, posted, not waited for: the work and its tensor (both must
    live until the rank reads it at its next export)."""
    tensor = torch.tensor([NOTHING if holds is None else holds], dtype=torch.int64)
    if device != "cpu":
        tensor = tensor.to(device)
    return group.send([tensor], dst, _TAG), tensor


def recv_answer(group: Any, src: int, device: str = "cpu") -> int | None:
    answer = torch.empty(1, dtype=torch.int64, device=device)
    group.recv([answer], src, _TAG).wait()
    value = int(answer.item())
    return None if value == NOTHING else value


# ---- the TU side ---------------------------------------------------------------------------------
class DeltaCollectiveSender(ChannelSender[_Prepared]):
    """``SnapshotWriter``'s interface over one group per GU, sending packed refreshes.

    The copy is made on the trainer's thread (the next optimizer step changes the tensors); the
    encoding happens on the publisher thread, in version order and only for exports that were not
    superseded, so the encoder's base is always the last version this rank sent."""

    _closed_hint = "create a new sender"

    def __init__(
        self,
        channels: Iterable[ChannelAddress],
        *,
        settings: DeltaSettings,
        bucket_mb: float = 512.0,
        run_id: str | None = None,
        board: Any = None,
    ) -> None:
        DeltaEncoder(settings.mode, full_interval=settings.full_interval)  # bad settings raise here
        self.settings = settings
        self._encoders: dict[int, DeltaEncoder] = {}
        self._answer_due: set[int] = set()
        """GUs this rank sent a refresh to whose answer it has not read yet."""
        self._lock = threading.Lock()
        self.delta_stats = DeltaStats()
        super().__init__(
            channels, bucket_mb=bucket_mb, run_id=run_id, board=board, thread_name="collective-delta-sender"
        )

    def stats(self) -> dict[str, float]:
        """summary.json: the TU's delta totals and the bytes it sent."""
        with self._lock:
            return {**self.channel_stats(), **self.delta_stats.as_summary()}

    def _payload(self, version: int, chosen: list[Any], layout: TrainingLayout, rank: int) -> _Prepared:
        # Into the base the rank's encoder let go, where there is one (DeltaEncoder.take_spare).
        encoder = self._encoders.get(rank)
        return _prepare(chosen, layout, rank, reuse=None if encoder is None else encoder.take_spare(chosen))

    def _release(self, pending: Pending[_Prepared]) -> None:
        """A superseded copy is simply dropped (nothing was encoded or sent)."""

    def _publish(self, pending: Pending[_Prepared]) -> ExportResult:
        prep = pending.payload
        assert prep is not None
        started = time.perf_counter()
        rank = pending.rank
        encoder = self._encoders.setdefault(
            rank, DeltaEncoder(self.settings.mode, full_interval=self.settings.full_interval)
        )

        def ask(address: ChannelAddress) -> int | None:
            group = self._group(address, rank)  # joined here at the first export
            if address.gu_id not in self._answer_due:
                return None  # nothing sent to it yet (or its group is new): it holds nothing
            holds = recv_answer(group, address.receiver_rank, bucket_device(address.backend))
            self._answer_due.discard(address.gu_id)
            return holds

        holds, _ = self._on_each(ask)
        base = encoder.base_version
        wanted = base if base is not None and base in holds.values() else None
        refresh = encoder.encode(pending.version, prep.tensors.items(), wanted, owned=True)
        full: DeltaRefresh | None = refresh if refresh.is_full else None
        if full is None and any(h != refresh.base_version for h in holds.values()):
            full = encoder.full_of_base(refresh)  # a GU that holds another version (or nothing)
        buffers = {r.is_full: np.frombuffer(bytearray(pack(r)), dtype=np.uint8) for r in (refresh, full) if r}
        key = shard_key(rank)
        entries = tuple(entry_for(n, t, key=key, layout=pending.layout) for n, t in prep.tensors.items())
        shard = ShardEntry(file=key, rank=rank, coords=prep.coords, nbytes=sum(e.nbytes for e in entries))
        layout = pending.layout.to_json()

        def header(buffer: np.ndarray) -> Header:
            return Header(
                version=pending.version, run_id=self.run_id, layout=layout, shard=shard, entries=entries,
                buckets=pieces(buffer.nbytes, self.bucket_bytes), delta=True,
            )  # fmt: skip

        def send(address: ChannelAddress) -> int:
            group = self._group(address, rank)
            is_full = refresh.is_full or holds.get(address.gu_id) != refresh.base_version
            buffer = buffers[is_full]
            send_refresh(group, header(buffer), buffer, address.receiver_rank, bucket_device(address.backend))
            self._answer_due.add(address.gu_id)
            return int(buffer.nbytes)

        sent, _ = self._on_each(send)
        with self._lock:
            self.delta_stats.record(refresh, 0.0)
            if full is not None and full is not refresh:
                self.delta_stats.record(full, 0.0, resend=True)
            self.bytes_sent += sum(sent.values())
            self.send_seconds += time.perf_counter() - started
        return self._announce(pending, header(buffers[refresh.is_full]), int(buffers[refresh.is_full].nbytes))


# ---- the GU side ---------------------------------------------------------------------------------
class CollectiveDeltaApplier:
    """A GU's host copies (one ``DeltaReceiver`` per TU rank), advanced by each version's packed
    refreshes (called on the receiver's thread), then put as the training ``MemorySnapshot``."""

    def __init__(self, gu_id: int, put: Callable[[Any], Any]) -> None:
        self.gu_id = gu_id
        self._put = put
        self.receivers: dict[int, DeltaReceiver] = {}
        self.stats = DeltaStats()
        self.metrics: OrderedDict[int, dict[str, float]] = OrderedDict()
        self._lock = threading.Lock()
        self._answers: list[tuple[Any, torch.Tensor]] = []

    def figures(self, version: int) -> dict[str, float] | None:
        with self._lock:
            return self.metrics.get(version)

    def summary(self) -> dict[str, float]:
        with self._lock:
            return self.stats.as_summary()

    def receive(self, group: Any, headers: list[Header], device: str) -> tuple[int, MemorySnapshot | str]:
        """One version from every rank: the snapshot, or why it was rejected (a reason string)."""
        for work, _ in self._answers:  # read by the ranks before they sent these headers
            work.wait()
        self._answers = []
        version = max(h.version for h in headers)
        buffers = recv_payloads(group, headers, device)
        try:
            result: MemorySnapshot | str = self._apply(version, headers, buffers)
        except SnapshotError as err:
            logger.error("GU %d: %s; asking the trainer for a full snapshot", self.gu_id, err)
            with self._lock:
                self.stats.resends += 1
            result = str(err)
        finally:
            # Answered whatever happened: each delta-sending rank reads one before its next send.
            self._answers = [
                post_answer(group, r, self._holds(r), device) for r, h in enumerate(headers) if h.delta
            ]
        return version, result

    def _holds(self, rank: int) -> int | None:
        receiver = self.receivers.get(rank)
        return None if receiver is None else receiver.base_version

    def _apply_rank(self, version: int, rank: int, buffer: np.ndarray) -> tuple[DeltaRefresh, float]:
        receiver = self.receivers.setdefault(rank, DeltaReceiver())
        try:
            refresh = unpack(buffer.tobytes())
        except Exception as err:  # safetensors' own errors: the bytes are not a packed refresh
            receiver.reset()
            raise SnapshotError(f"weight delta v{version}, rank {rank}: unreadable ({err})") from err
        if refresh.version != version:
            receiver.reset()
            raise SnapshotError(f"weight delta v{version}, rank {rank}: the bytes hold v{refresh.version}")
        return refresh, receiver.apply(refresh)  # BaseMismatch / DeltaMismatch: the copy is reset

    def _apply(self, version: int, headers: list[Header], buffers: list[np.ndarray]) -> MemorySnapshot:
        if any(h.version != version or not h.delta for h in headers):
            for r in range(len(headers)):  # out of step: every copy is suspect, start over in full
                self.receivers.pop(r, None)
            raise SnapshotError(
                f"weight delta v{version}: TU ranks sent {[(h.version, 'delta' if h.delta else 'full') for h in headers]}"
            )
        sent = changed = total = 0
        encode_s = apply_s = 0.0
        errors: list[SnapshotError] = []
        for r, buffer in enumerate(buffers):
            # Every rank's refresh is applied even after another's failed: the ranks whose copy
            # is good keep their base (only the failed one is resent in full).
            try:
                refresh, seconds = self._apply_rank(version, r, buffer)
            except SnapshotError as err:
                errors.append(err)
                continue
            with self._lock:
                self.stats.record(refresh, seconds)
            sent += refresh.nbytes
            changed += refresh.changed_elements
            total += refresh.total_elements
            encode_s += refresh.encode_seconds
            apply_s += seconds
        if errors:
            raise errors[0]
        layout = TrainingLayout.from_json(headers[0].layout)
        # The copy into the object store: the receivers' copies change in place at the next apply.
        shards = tuple(
            memory_shard(h.shard.rank, h.shard.coords, self.receivers[r].tensors().items(), layout, self._put)
            for r, h in enumerate(headers)
        )
        with self._lock:
            self.metrics[version] = {
                "delta_bytes_sent": float(sent),
                "delta_changed_fraction": changed / max(total, 1),
                "delta_encode_seconds": encode_s,
                "delta_apply_seconds": apply_s,
                "delta_refreshes_applied": float(len(headers)),
            }
            while len(self.metrics) > KEEP_METRICS:
                self.metrics.popitem(last=False)
        return MemorySnapshot(
            version=version, run_id=headers[0].run_id, kind="training", layout=headers[0].layout,
            shards=shards, medium="collective",
        )  # fmt: skip
