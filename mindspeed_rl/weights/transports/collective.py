"""``weight_transport: collective``: bucketed sends over one process group per GU (no shared
disk; its backend is ``async_config.collective_backend``: gloo on CPU, NCCL / HCCL on devices).
The TU ranks send (``weights.collective.CollectiveSender``), the GU's receiver converts bucket
by bucket as they arrive (``weights.collective_receiver``), actors fetch the converted buffers.
``weight_delta`` auto / on: the TU ranks send packed deltas instead and the GU answers with the
version it holds; it applies them to its host copy and puts that as the training snapshot its
actors fetch and convert (``weights.delta_collective``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.weights.transports.base import Converted, MemoryHandles, memory_reader

if TYPE_CHECKING:
    import torch

    from mindspeed_rl.config_cls.async_config import WeightTransport
    from mindspeed_rl.weights.collective_backend import Backend
    from mindspeed_rl.weights.layout import InferenceLayout
    from mindspeed_rl.weights.transports.base import DeltaSettings

RECEIVE_WAIT_S = 600.0
"""Longest a GU's conversion waits for a collective version the TU announced to finish arriving."""


class CollectiveGu:
    def __init__(self, layout: InferenceLayout, delta: DeltaSettings | None = None, gu_id: int = 0) -> None:
        self.layout = layout
        self._delta_on = delta is not None and delta.mode != "off"
        self._handles = MemoryHandles()
        self._received: Any = None
        self.receiver: Any = None

    def open_channel(self, gu_id: int, world_size: int, backend: Backend) -> Any:
        """Start this GU's store and receiver (the group, on ``backend``, forms once the TU ranks
        join at their first export); returns the ``ChannelAddress`` they join."""
        import ray

        from mindspeed_rl.weights.collective import ChannelAddress, open_store
        from mindspeed_rl.weights.collective_receiver import CollectiveReceiver, ReceivedSnapshots

        if self.receiver is not None:
            raise ValueError("the weights channel of this GU is already open: one group per GU, reused")
        host = ray.util.get_node_ip_address()
        store = open_store(host, world_size)
        address = ChannelAddress(
            gu_id=gu_id, host=host, port=int(store.port), world_size=world_size, backend=backend
        )
        self._received = ReceivedSnapshots()
        applier = None
        if self._delta_on:
            from mindspeed_rl.weights.delta_collective import CollectiveDeltaApplier

            applier = CollectiveDeltaApplier(gu_id, ray.put)
        self.receiver = CollectiveReceiver(address, store, self.layout, self._received, ray.put, applier)
        self.receiver.start()
        return address

    def bind_receiver_device(self, index: int) -> None:
        """NCCL / HCCL: the device of this process the receiver receives on."""
        if self.receiver is not None:
            self.receiver.bind_device(index)

    def convert(self, version: int, path: str, handle: Any = None) -> Converted:
        from mindspeed_rl.weights.manifest import SnapshotError

        started = time.perf_counter()
        if self._received is None:
            raise SnapshotError("weight_transport=collective, but this GU's channel was never opened")
        got = self._received.wait_for(version, RECEIVE_WAIT_S)
        if isinstance(got, str):
            raise SnapshotError(f"collective snapshot v{version}: {got}")
        kept = self._handles.keep(version, got, started)
        figures = self.receiver.delta.figures(version) if self.receiver.delta is not None else None
        return (
            kept
            if figures is None
            else Converted(path=kept.path, seconds=kept.seconds, metrics=dict(figures))
        )

    def reload_handle(self, path: str) -> Any:
        return self._handles.get(path)

    def delta_stats(self) -> dict[str, float]:
        if self.receiver is None or self.receiver.delta is None:
            return {}
        return self.receiver.delta.summary()


class Collective:
    name: WeightTransport = "collective"
    needs_shared_folder = False
    opens_channels = True
    needs_one_torch = True

    def exporter(
        self,
        root_dir: Path,
        keep_last: int,
        *,
        run_id: str | None = None,
        channels: Iterable[Any] = (),
        bucket_mb: float = 512.0,
        board: Any = None,
        delta: DeltaSettings | None = None,
    ) -> Any:
        if delta is not None and delta.mode != "off":
            from mindspeed_rl.weights.delta_collective import DeltaCollectiveSender

            return DeltaCollectiveSender(
                channels, settings=delta, bucket_mb=bucket_mb, run_id=run_id, board=board
            )
        from mindspeed_rl.weights.collective import CollectiveSender

        return CollectiveSender(channels, bucket_mb=bucket_mb, run_id=run_id, board=board)

    def gu_end(
        self,
        cache_dir: Path,
        layout: InferenceLayout | None = None,
        *,
        delta: DeltaSettings | None = None,
        gu_id: int = 0,
    ) -> CollectiveGu:
        from mindspeed_rl.weights.layout import InferenceLayout

        return CollectiveGu(layout or InferenceLayout(), delta, gu_id)

    def actor_reader(
        self, handle: Any, layout: InferenceLayout | None = None, *, rank: int = 0
    ) -> Callable[[], tuple[Iterator[tuple[str, torch.Tensor]], int]]:
        return memory_reader(handle, layout, rank=rank)


TRANSPORT = Collective()
