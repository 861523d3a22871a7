"""The seam of ``weight_transport``: what the Training Unit exports with, what a Generation Unit
converts with, and what an actor loads with, per transport. Workers call only these, so the
snapshot path's contract (export → announce → convert → deferred reload) is the same code path
for every medium; only the bytes' carrier changes.

::

    TU:    exporter(transport, ...)        SnapshotWriter | ObjectStoreExporter | CollectiveSender
    GU:    GuWeights.open_channel()         collective only: the GU's one process group (at start)
           GuWeights.convert(v, path, h)   shared_fs: GuConverter into the cache folder
                                           object_store: check the MemorySnapshot (no byte copied)
                                           collective: wait for the receiver's converted version
           GuWeights.reload_handle(path)   what the actor is handed: None (a folder) | MemorySnapshot
    actor: memory_reader(handle)           fetch + check the buffers, then an iterator for load_weights
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mindspeed_rl.weights.collective_backend import Backend
from mindspeed_rl.weights.layout import InferenceLayout
from mindspeed_rl.weights.manifest import SnapshotError
from mindspeed_rl.weights.transport import WeightTransport, check_transport, is_memory_path, memory_path

logger = logging.getLogger(__name__)
RECEIVE_WAIT_S = 600.0
"""Longest a GU's conversion waits for a collective version the TU announced to finish arriving."""


def exporter(
    transport: str,
    root_dir: Path,
    keep_last: int,
    *,
    run_id: str | None = None,
    channels: Iterable[Any] = (),
    bucket_mb: float = 512.0,
    board: Any = None,
) -> Any:
    """The TU's exporter for ``transport`` (all three share SnapshotWriter's interface)."""
    kind = check_transport(transport)
    if kind == "shared_fs":
        from mindspeed_rl.weights.export import SnapshotWriter

        return SnapshotWriter(root_dir, keep_last=keep_last, run_id=run_id)
    if kind == "object_store":
        from mindspeed_rl.weights.object_store import ObjectStoreExporter

        return ObjectStoreExporter(keep_last=keep_last, run_id=run_id, board=board)
    from mindspeed_rl.weights.collective import CollectiveSender

    return CollectiveSender(channels, bucket_mb=bucket_mb, run_id=run_id, board=board)


def exporter_stats(writer: Any) -> dict[str, float]:
    """Transport figures for summary.json (object-store bytes held, collective bytes sent)."""
    for method in ("store_stats", "stats"):
        if hasattr(writer, method):
            return {k: float(v) for k, v in getattr(writer, method)().items()}
    return {}


def board_for(run_id: str, world_size: int, keep_last: int) -> Any:
    """The run's ``SnapshotBoard`` actor (created by the first rank to ask, found by the others)."""
    import ray

    from mindspeed_rl.weights.object_store import SnapshotBoard

    return (
        ray.remote(SnapshotBoard)
        .options(name=f"snapshot-board-{run_id}", get_if_exists=True, num_cpus=0)
        .remote(world_size, keep_last)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Converted:
    path: str | None
    """The converted snapshot's path (a memory path for in-memory transports); None = rejected."""
    seconds: float
    reason: str | None = None


class GuWeights:
    """A GU's end of the weight flow for its transport."""

    def __init__(self, transport: str, cache_dir: Path, layout: InferenceLayout | None = None) -> None:
        self.transport: WeightTransport = check_transport(transport)
        self.layout = layout or InferenceLayout()
        self._converter: Any = None
        if self.transport == "shared_fs":
            from mindspeed_rl.weights.convert import GuConverter

            self._converter = GuConverter(Path(cache_dir), self.layout, num_threads=1)
        self._handles: OrderedDict[str, Any] = OrderedDict()
        self._received: Any = None
        self.receiver: Any = None

    def open_channel(self, gu_id: int, world_size: int, backend: Backend) -> Any:
        """collective: start this GU's store and receiver (the group, on ``backend``, forms once
        the TU ranks join at their first export); returns the ``ChannelAddress`` they join."""
        import ray

        from mindspeed_rl.weights.collective import ChannelAddress, open_store
        from mindspeed_rl.weights.collective_receiver import CollectiveReceiver, ReceivedSnapshots

        if self.transport != "collective":
            raise ValueError(f"open_channel is for weight_transport=collective, not {self.transport}")
        if self.receiver is not None:
            raise ValueError("the weights channel of this GU is already open: one group per GU, reused")
        host = ray.util.get_node_ip_address()
        store = open_store(host, world_size)
        address = ChannelAddress(
            gu_id=gu_id, host=host, port=int(store.port), world_size=world_size, backend=backend
        )
        self._received = ReceivedSnapshots()
        self.receiver = CollectiveReceiver(address, store, self.layout, self._received, ray.put)
        self.receiver.start()
        return address

    def bind_receiver_device(self, index: int) -> None:
        """collective on NCCL / HCCL: the device of this process the receiver receives on."""
        if self.receiver is not None:
            self.receiver.bind_device(index)

    def convert(self, version: int, path: str, handle: Any = None) -> Converted:
        started = time.perf_counter()
        if self.transport == "shared_fs":
            from mindspeed_rl.weights.manifest import SnapshotInfo as StoredSnapshot

            if is_memory_path(path):
                raise SnapshotError(f"v{version} is an in-memory snapshot, but this GU reads shared_fs files")
            result = self._converter.convert(StoredSnapshot(version=version, path=Path(path)))
            return Converted(path=str(result.converted.path), seconds=result.total_seconds)
        if self.transport == "object_store":
            from mindspeed_rl.weights.memory_snapshot import MemorySnapshot, check_snapshot

            if not isinstance(handle, MemorySnapshot):
                raise SnapshotError(f"v{version} was announced without its object-store handle ({path})")
            check_snapshot(handle, version, self.layout)
            return self._keep(version, handle, started)
        if self._received is None:
            raise SnapshotError("weight_transport=collective, but this GU's channel was never opened")
        got = self._received.wait_for(version, RECEIVE_WAIT_S)
        if isinstance(got, str):
            raise SnapshotError(f"collective snapshot v{version}: {got}")
        return self._keep(version, got, started)

    def reload_handle(self, path: str) -> Any:
        """What an actor reloading ``path`` is handed beside it: the memory snapshot, or None."""
        return self._handles.get(path) if is_memory_path(path) else None

    def _keep(self, version: int, handle: Any, started: float) -> Converted:
        path = memory_path(version)
        self._handles[path] = handle
        # The newest two: one actors may still be loading, one being offered; older ones are freed.
        while len(self._handles) > 2:
            self._handles.popitem(last=False)
        return Converted(path=path, seconds=time.perf_counter() - started)


def memory_reader(
    handle: Any, layout: InferenceLayout | None = None, *, rank: int = 0
) -> Callable[[], tuple[Iterator[tuple[str, torch.Tensor]], int]]:
    """For ``ReloadPolicy.maybe_reload_memory``: fetch the buffers (zero-copy on this node), check
    them and the conversion plan, then the iterator the engine loads from."""
    import ray

    from mindspeed_rl.weights.memory_snapshot import (
        MemorySnapshot,
        check_snapshot,
        fetch_tensors,
        iter_converted,
    )

    if not isinstance(handle, MemorySnapshot):
        raise TypeError(f"a memory reload needs a MemorySnapshot, got {type(handle).__name__}")
    target = layout or InferenceLayout()

    def read() -> tuple[Iterator[tuple[str, torch.Tensor]], int]:
        check_snapshot(handle, handle.version, target)
        tensors = fetch_tensors(handle, ray.get)
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        return iter_converted(handle, tensors, target, rank=rank), nbytes

    return read
