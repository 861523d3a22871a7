"""``weight_transport: shared_fs`` (the default): safetensors files in ``snapshot_dir``, which
every node must see (the start-up probe checks it). The TU writes them (``export.SnapshotWriter``),
the GU converts them into its cache folder (``convert.GuConverter``), actors read the folder.
``weight_delta`` auto / on: the TU writes packed deltas instead and the GU applies them to its
host copy before converting (``weights.delta_fs``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.weights.transports.base import Converted

if TYPE_CHECKING:
    import torch

    from mindspeed_rl.config_cls.async_config import WeightTransport
    from mindspeed_rl.weights.collective_backend import Backend
    from mindspeed_rl.weights.delta_fs import DeltaApplier
    from mindspeed_rl.weights.layout import InferenceLayout
    from mindspeed_rl.weights.transports.base import DeltaSettings


class SharedFsGu:
    receiver: Any = None

    def __init__(
        self, cache_dir: Path, layout: InferenceLayout, delta: DeltaSettings | None = None, gu_id: int = 0
    ) -> None:
        from mindspeed_rl.weights.convert import GuConverter
        from mindspeed_rl.weights.delta_fs import DeltaApplier

        # Not durable: the GU's cache is derived data, read by its actors on this host; a merged
        # or delta-applied copy is written without fsync (weight_delta off and on alike), and a
        # copy written before a host crash is converted again (GuConverter's docstring). Its
        # files carry xxh3_64 (manifest.CHECKSUM_ALGOS): a delta's applied copy hands over the
        # checksums it was checked with, a merge hashes while writing, actors verify either.
        self._converter = GuConverter(
            Path(cache_dir), layout, num_threads=1, durable=False, checksum_algo="xxh3_64"
        )
        # The applied copy lives in this GU's memory and is converted from there.
        self._delta: DeltaApplier | None = (
            DeltaApplier(gu_id) if delta is not None and delta.mode != "off" else None
        )

    def open_channel(self, gu_id: int, world_size: int, backend: Backend) -> Any:
        raise ValueError("open_channel is for weight_transport=collective, not shared_fs")

    def bind_receiver_device(self, index: int) -> None:
        """No channel: nothing to bind."""

    def convert(self, version: int, path: str, handle: Any = None) -> Converted:
        from mindspeed_rl.weights.manifest import SnapshotError, SnapshotInfo
        from mindspeed_rl.weights.transport import is_memory_path

        if is_memory_path(path):
            raise SnapshotError(f"v{version} is an in-memory snapshot, but this GU reads shared_fs files")
        if self._delta is None:
            result = self._converter.convert(SnapshotInfo(version=version, path=Path(path)))
            return Converted(path=str(result.converted.path), seconds=result.total_seconds)
        started = time.perf_counter()
        # Raises SnapshotError after asking for a full; converted from the in-memory copy.
        result = self._delta.apply(
            version, Path(path), lambda a: self._converter.convert_tensors(a.manifest, a.tensors)
        )
        return Converted(
            path=str(result.converted.path),
            seconds=time.perf_counter() - started,
            metrics=dict(self._delta.last),
        )

    def reload_handle(self, path: str) -> Any:
        return None  # actors read the converted folder itself

    def delta_stats(self) -> dict[str, float]:
        return {} if self._delta is None else self._delta.stats.as_summary()


class SharedFs:
    name: WeightTransport = "shared_fs"
    needs_shared_folder = True
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
        from mindspeed_rl.weights.export import SnapshotWriter

        if delta is not None and delta.mode != "off":
            from mindspeed_rl.weights.delta_fs import DeltaSnapshotWriter

            return DeltaSnapshotWriter(root_dir, settings=delta, keep_last=keep_last, run_id=run_id)
        return SnapshotWriter(root_dir, keep_last=keep_last, run_id=run_id)

    def gu_end(
        self,
        cache_dir: Path,
        layout: InferenceLayout | None = None,
        *,
        delta: DeltaSettings | None = None,
        gu_id: int = 0,
    ) -> SharedFsGu:
        from mindspeed_rl.weights.layout import InferenceLayout

        return SharedFsGu(cache_dir, layout or InferenceLayout(), delta, gu_id)

    def actor_reader(
        self, handle: Any, layout: InferenceLayout | None = None, *, rank: int = 0
    ) -> Callable[[], tuple[Iterator[tuple[str, torch.Tensor]], int]]:
        raise TypeError("weight_transport=shared_fs snapshots are folders: actors read files, not a handle")


TRANSPORT = SharedFs()
