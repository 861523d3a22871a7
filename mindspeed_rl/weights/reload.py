"""Deferred reload for one generation actor.

::

    actor loop:  receive minibatch ─► policy.maybe_reload(latest, engine_load) ─► with policy.generating(): generate
                                           │ newer than mine?  no ─► "up_to_date"
                                           │ lease + read + verify all tensors of my rank (or only verify: from_folder)
                                           │    any defect ─► log, keep current weights, "rejected"
                                           ▼
                                      engine_load(tensors) ─► version = latest.version, "loaded"

Validation (sizes, header, and every tensor's CRC-32 taken while its bytes are read:
this is the end-to-end check of the weight flow, see convert.py) finishes before the
engine is touched, so a bad snapshot can never leave an engine half-loaded. Two ways to hand
the weights over, by what the engine takes:

- ``maybe_reload`` (an in-process engine takes tensors): the verified tensors themselves, so
  one rank's weights sit in host memory during the reload.
- ``maybe_reload_from_folder`` (an engine whose workers read the folder themselves: TP > 1
  vLLM): the same checks streamed through an 8 MiB buffer per thread, nothing kept, then the
  folder path, under the same lease. Host memory stays at the buffers whatever the model size;
  the verification's reads also leave the file in the page cache the workers then read from.

An exception raised by ``engine_load_fn`` itself propagates: the engine's state is then
unknown and the actor must be restarted.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import torch

from mindspeed_rl.weights.manifest import ShardEntry, SnapshotError, SnapshotInfo, SnapshotManifest
from mindspeed_rl.weights.shardio import read_shard, verify_shard
from mindspeed_rl.weights.store import lease

logger = logging.getLogger(__name__)

EngineLoadFn = Callable[[Iterable[tuple[str, torch.Tensor]]], None]
FolderLoadFn = Callable[[Path], None]
"""Loads the snapshot folder (its one shard file) into the engine."""
_T = TypeVar("_T")
ReloadStatus = Literal["loaded", "up_to_date", "no_snapshot", "rejected"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReloadResult:
    """``version`` is the actor's policy version after the call; seconds feed the T_load metric."""

    status: ReloadStatus
    version: int
    target_version: int | None = None
    reason: str | None = None
    read_seconds: float = 0.0
    engine_seconds: float = 0.0
    nbytes: int = 0

    @property
    def load_seconds(self) -> float:
        return self.read_seconds + self.engine_seconds


class ReloadPolicy:
    """Tracks which snapshot an actor's engine holds and swaps it only between minibatches."""

    def __init__(self, current_version: int, *, rank: int = 0, num_threads: int | None = None) -> None:
        self.version = current_version
        self.rank = rank
        self.num_threads = num_threads
        self._generating = False
        self._rejected: dict[int, str] = {}

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Mark a minibatch in progress; `maybe_reload` refuses to run inside it."""
        self._generating = True
        try:
            yield
        finally:
            self._generating = False

    def maybe_reload(self, latest: SnapshotInfo | None, engine_load_fn: EngineLoadFn) -> ReloadResult:
        """Load ``latest`` if newer: read and verify this rank's tensors, then ``engine_load_fn(tensors)``."""

        def read(snapshot: SnapshotInfo) -> tuple[dict[str, torch.Tensor], int]:
            manifest, shard = self._manifest_and_shard(snapshot)
            tensors = read_shard(snapshot.path, manifest, shard, num_threads=self.num_threads)
            return tensors, sum(t.numel() * t.element_size() for t in tensors.values())

        # The tensors are in memory once read: the engine load needs no lease.
        return self._reload(latest, read, lambda tensors: engine_load_fn(tensors.items()), leased_load=False)

    def maybe_reload_from_folder(
        self, latest: SnapshotInfo | None, engine_load_fn: FolderLoadFn
    ) -> ReloadResult:
        """Load ``latest`` if newer: verify its one shard file streaming (no tensor kept), then
        ``engine_load_fn(folder)``, both under one lease so retention cannot delete the folder between."""

        def verify(snapshot: SnapshotInfo) -> tuple[Path, int]:
            manifest, shard = self._manifest_and_shard(snapshot)
            if len(manifest.shards) != 1:
                raise SnapshotError(
                    f"snapshot v{manifest.version} has {len(manifest.shards)} shard files, and an engine "
                    "that loads a folder reads every file in it; convert for this GU with one inference "
                    "rank (InferenceLayout()): the engine shards the full replica itself"
                )
            return snapshot.path, verify_shard(snapshot.path, manifest, shard, num_threads=self.num_threads)

        return self._reload(latest, verify, engine_load_fn, leased_load=True)

    def maybe_reload_memory(
        self,
        latest: SnapshotInfo | None,
        read: Callable[[], tuple[Iterable[tuple[str, torch.Tensor]], int]],
        engine_load_fn: EngineLoadFn,
    ) -> ReloadResult:
        """Load a memory snapshot (``weight_transport`` object_store / collective) if newer:
        ``read()`` fetches and checks its buffers (raising ``SnapshotError`` on a defect) and returns
        the weights as an iterator (``memory_snapshot.iter_converted``) and their bytes. No lease:
        the reader's object references keep the buffers alive until the load is done."""
        return self._reload(latest, lambda _: read(), engine_load_fn, leased_load=True, hold=_no_lease)

    def _reload(
        self,
        latest: SnapshotInfo | None,
        read: Callable[[SnapshotInfo], tuple[_T, int]],
        load: Callable[[_T], None],
        *,
        leased_load: bool,
        hold: Callable[[SnapshotInfo], contextlib.AbstractContextManager[object]] = lease,
    ) -> ReloadResult:
        if self._generating:
            raise RuntimeError(
                "maybe_reload called while a minibatch is being generated; call it between minibatches"
            )
        if latest is None:
            return ReloadResult(status="no_snapshot", version=self.version)
        if latest.version <= self.version:
            return ReloadResult(status="up_to_date", version=self.version, target_version=latest.version)
        if latest.version in self._rejected:
            return self._rejected_result(latest.version, self._rejected[latest.version])
        started = time.perf_counter()
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(hold(latest))
                weights, nbytes = read(latest)
            except (SnapshotError, OSError) as err:
                logger.error(
                    "not loading snapshot v%d from %s: %s; keeping v%d",
                    latest.version,
                    latest.path,
                    err,
                    self.version,
                )
                self._rejected[latest.version] = str(err)
                return self._rejected_result(latest.version, str(err))
            read_seconds = time.perf_counter() - started
            engine_started = time.perf_counter()
            if leased_load:
                load(weights)
        if not leased_load:
            load(weights)
        del weights
        self.version = latest.version
        return ReloadResult(
            status="loaded",
            version=self.version,
            target_version=latest.version,
            read_seconds=read_seconds,
            engine_seconds=time.perf_counter() - engine_started,
            nbytes=nbytes,
        )

    def _rejected_result(self, target: int, reason: str) -> ReloadResult:
        return ReloadResult(status="rejected", version=self.version, target_version=target, reason=reason)

    def _manifest_and_shard(self, snapshot: SnapshotInfo) -> tuple[SnapshotManifest, ShardEntry]:
        manifest = SnapshotManifest.load(snapshot.path)
        if manifest.version != snapshot.version:
            raise SnapshotError(
                f"{snapshot.path} holds version {manifest.version}, announced as {snapshot.version}"
            )
        if manifest.kind == "training":
            # A single-shard training export already holds full tensors (torch backend): no conversion needed.
            if len(manifest.shards) != 1 or manifest.training_layout().world_size != 1:
                raise SnapshotError(
                    f"snapshot v{manifest.version} has a sharded training layout; convert it for this GU "
                    "with GuConverter and reload from the GU cache"
                )
            return manifest, manifest.shards[0]
        return manifest, manifest.shard(self.rank)


@contextlib.contextmanager
def _no_lease(_: SnapshotInfo) -> Iterator[None]:
    yield
