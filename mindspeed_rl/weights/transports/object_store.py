"""``weight_transport: object_store``: host buffers in Ray's object store (no shared disk). The
TU puts them (``weights.object_store.ObjectStoreExporter``), the GU checks the announced
``MemorySnapshot`` (no byte copied), actors fetch the buffers zero-copy on their node.
``weight_delta`` auto / on: the TU puts packed deltas instead, the GU applies them to its host
copy and puts that as the snapshot its actors fetch (``weights.delta_object_store``)."""

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
    from mindspeed_rl.weights.delta_object_store import ObjectStoreDeltaApplier
    from mindspeed_rl.weights.layout import InferenceLayout
    from mindspeed_rl.weights.transports.base import DeltaSettings


class ObjectStoreGu:
    receiver: Any = None

    def __init__(self, layout: InferenceLayout, delta: DeltaSettings | None = None, gu_id: int = 0) -> None:
        from mindspeed_rl.weights.delta_object_store import ObjectStoreDeltaApplier

        self.layout = layout
        self._handles = MemoryHandles()
        self._delta: ObjectStoreDeltaApplier | None = (
            ObjectStoreDeltaApplier(gu_id) if delta is not None and delta.mode != "off" else None
        )

    def open_channel(self, gu_id: int, world_size: int, backend: Backend) -> Any:
        raise ValueError("open_channel is for weight_transport=collective, not object_store")

    def bind_receiver_device(self, index: int) -> None:
        """No channel: nothing to bind."""

    def convert(self, version: int, path: str, handle: Any = None) -> Converted:
        from mindspeed_rl.weights.manifest import SnapshotError
        from mindspeed_rl.weights.memory_snapshot import MemorySnapshot, check_snapshot

        started = time.perf_counter()
        if self._delta is not None:
            from mindspeed_rl.weights.delta_object_store import DeltaSnapshot

            if not isinstance(handle, DeltaSnapshot) or handle.version != version:
                raise SnapshotError(f"v{version} was announced without its delta handle ({path})")
            applied = self._delta.apply(handle)  # raises SnapshotError after asking for a full
            check_snapshot(applied, version, self.layout)
            kept = self._handles.keep(version, applied, started)
            return Converted(path=kept.path, seconds=kept.seconds, metrics=dict(self._delta.last))
        if not isinstance(handle, MemorySnapshot):
            raise SnapshotError(f"v{version} was announced without its object-store handle ({path})")
        check_snapshot(handle, version, self.layout)
        return self._handles.keep(version, handle, started)

    def reload_handle(self, path: str) -> Any:
        return self._handles.get(path)

    def delta_stats(self) -> dict[str, float]:
        return {} if self._delta is None else self._delta.stats.as_summary()


class ObjectStore:
    name: WeightTransport = "object_store"
    needs_shared_folder = False
    opens_channels = False
    needs_one_torch = False

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
            from mindspeed_rl.weights.delta_object_store import DeltaObjectStoreExporter

            return DeltaObjectStoreExporter(settings=delta, keep_last=keep_last, run_id=run_id)
        from mindspeed_rl.weights.object_store import ObjectStoreExporter

        return ObjectStoreExporter(keep_last=keep_last, run_id=run_id, board=board)

    def gu_end(
        self,
        cache_dir: Path,
        layout: InferenceLayout | None = None,
        *,
        delta: DeltaSettings | None = None,
        gu_id: int = 0,
    ) -> ObjectStoreGu:
        from mindspeed_rl.weights.layout import InferenceLayout

        return ObjectStoreGu(layout or InferenceLayout(), delta, gu_id)

    def actor_reader(
        self, handle: Any, layout: InferenceLayout | None = None, *, rank: int = 0
    ) -> Callable[[], tuple[Iterator[tuple[str, torch.Tensor]], int]]:
        return memory_reader(handle, layout, rank=rank)


TRANSPORT = ObjectStore()
