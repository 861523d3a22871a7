"""Deferred reload for one generation actor.

::

    actor loop:  receive minibatch ─► policy.maybe_reload(latest, engine_load) ─► with policy.generating(): generate
                                           │ newer than mine?  no ─► "up_to_date"
                                           │ lease + read + verify all tensors of my rank
                                           │    any defect ─► log, keep current weights, "rejected"
                                           ▼
                                      engine_load(tensors) ─► version = latest.version, "loaded"

Validation (sizes, header, and every tensor's CRC-32 taken while its bytes are read:
this is the end-to-end check of the weight flow, see convert.py) finishes before the
engine is touched, so a bad snapshot can never leave an engine half-loaded. The price is holding one rank's weights in host
memory during the reload. An exception raised by ``engine_load_fn`` itself
propagates: the engine's state is then unknown and the actor must be restarted.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from mindspeed_rl.weights.manifest import SnapshotError, SnapshotInfo, SnapshotManifest
from mindspeed_rl.weights.shardio import read_shard
from mindspeed_rl.weights.store import lease

logger = logging.getLogger(__name__)

EngineLoadFn = Callable[[Iterable[tuple[str, torch.Tensor]]], None]
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
        try:
            with lease(latest):
                tensors = self._read_verified(latest)
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
        engine_load_fn(tensors.items())
        self.version = latest.version
        return ReloadResult(
            status="loaded",
            version=self.version,
            target_version=latest.version,
            read_seconds=read_seconds,
            engine_seconds=time.perf_counter() - engine_started,
            nbytes=sum(t.numel() * t.element_size() for t in tensors.values()),
        )

    def _rejected_result(self, target: int, reason: str) -> ReloadResult:
        return ReloadResult(status="rejected", version=self.version, target_version=target, reason=reason)

    def _read_verified(self, snapshot: SnapshotInfo) -> dict[str, torch.Tensor]:
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
            shard = manifest.shards[0]
        else:
            shard = manifest.shard(self.rank)
        return read_shard(snapshot.path, manifest, shard, num_threads=self.num_threads)
