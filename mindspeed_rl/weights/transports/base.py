"""The ``Transport`` protocol every weight transport implements, and the pieces the in-memory
ones share (the GU's newest-two handle cache, the actor's reader).

Whatever the medium, the contract of the snapshot path is the same: increasing versions, the
integrity checks of each hop, at most one export in flight per TU rank (a newer one supersedes
the queued one), a snapshot announced to the Control Unit only once complete, and actors that
reload only between minibatches. A transport only changes what carries the bytes.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import torch

    from mindspeed_rl.config_cls.async_config import WeightTransport
    from mindspeed_rl.weights.collective_backend import Backend
    from mindspeed_rl.weights.layout import InferenceLayout


@dataclass(frozen=True, slots=True, kw_only=True)
class DeltaSettings:
    """``async_config.weight_delta`` / ``delta_full_interval``, carried typed from the plan to the
    TU's exporter and every GU's end (here, not in ``weights.delta``: the plan imports no torch)."""

    mode: Literal["off", "auto", "on"]
    full_interval: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Converted:
    path: str | None
    """The converted snapshot's path (a memory path for in-memory transports); None = rejected."""
    seconds: float
    reason: str | None = None
    metrics: dict[str, float] | None = None
    """``weight_delta`` auto / on: this refresh's delta figures (``DeltaApplier.last``)."""


class GuEnd(Protocol):
    """A Generation Unit's end of one transport (made once per GU)."""

    receiver: Any
    """collective: the running receiver once the channel is open; None otherwise."""

    def open_channel(self, gu_id: int, world_size: int, backend: Backend) -> Any: ...

    def bind_receiver_device(self, index: int) -> None: ...

    def convert(self, version: int, path: str, handle: Any = None) -> Converted: ...

    def reload_handle(self, path: str) -> Any: ...

    def delta_stats(self) -> dict[str, float]:
        """``weight_delta`` auto / on: the GU's totals for summary.json ({} without delta)."""
        ...


class Transport(Protocol):
    """One weight transport: the TU's exporter, the GU's end, the actor's reader, and the facts
    the start-up code needs about it (asked as properties, never by comparing names)."""

    @property
    def name(self) -> WeightTransport: ...

    @property
    def needs_shared_folder(self) -> bool:
        """Every GU must see the TU's snapshot folder (checked by the start-up probe)."""
        ...

    @property
    def opens_channels(self) -> bool:
        """One process group per GU, opened at start (``collective_backend`` / ``bucket_mb`` apply)."""
        ...

    @property
    def needs_one_torch(self) -> bool:
        """The bytes travel through torch.distributed: both roles' environments need one torch."""
        ...

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
        """The TU's exporter (``SnapshotWriter``'s interface: export / wait / close / num_superseded)."""
        ...

    def gu_end(
        self,
        cache_dir: Path,
        layout: InferenceLayout | None = None,
        *,
        delta: DeltaSettings | None = None,
        gu_id: int = 0,
    ) -> GuEnd:
        """``delta``: ``weight_delta`` auto / on (None or mode off: full snapshots, as before)."""
        ...

    def actor_reader(
        self, handle: Any, layout: InferenceLayout | None = None, *, rank: int = 0
    ) -> Callable[[], tuple[Iterator[tuple[str, torch.Tensor]], int]]:
        """For ``ReloadPolicy.maybe_reload_memory``: fetch and check an in-memory snapshot, then
        the iterator the engine loads from. Raises for a transport whose actors read files."""
        ...


def exporter_stats(writer: Any) -> dict[str, float]:
    """Transport figures for summary.json (object-store bytes held, collective bytes sent)."""
    for method in ("store_stats", "stats"):
        if hasattr(writer, method):
            return {k: float(v) for k, v in getattr(writer, method)().items()}
    return {}


class MemoryHandles:
    """The GU's newest two in-memory snapshots, by memory path: one actors may still be
    loading, one being offered; older ones are let go (which frees their buffers)."""

    def __init__(self) -> None:
        self._handles: OrderedDict[str, Any] = OrderedDict()

    def keep(self, version: int, handle: Any, started: float) -> Converted:
        from mindspeed_rl.weights.transport import memory_path

        path = memory_path(version)
        self._handles[path] = handle
        while len(self._handles) > 2:
            self._handles.popitem(last=False)
        return Converted(path=path, seconds=time.perf_counter() - started)

    def get(self, path: str) -> Any:
        from mindspeed_rl.weights.transport import is_memory_path

        return self._handles.get(path) if is_memory_path(path) else None


def memory_reader(
    handle: Any, layout: InferenceLayout | None = None, *, rank: int = 0
) -> Callable[[], tuple[Iterator[tuple[str, torch.Tensor]], int]]:
    """The actor's reader of an in-memory snapshot (object_store, collective): fetch the buffers
    (zero-copy on this node), check them and the conversion plan, then the iterator."""
    import ray

    from mindspeed_rl.weights.layout import InferenceLayout
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
