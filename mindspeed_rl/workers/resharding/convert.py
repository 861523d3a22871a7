"""Generation-side conversion, once per GU per snapshot.

::

    <export root>/v<N>  ──read + verify every shard──► pieces ──NameMap──► merge TP/EP ──► split per GU rank
                                                                                          │
    <GU cache>/v<N>/rank-<r>.safetensors + manifest (kind "inference") ◄── atomic publish ─┘

Actors then load only their rank's file from the GU cache (see reload.py).
Verification is complete: a snapshot with a bad file is rejected here and
never reaches the cache, so actors keep their weights.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mindspeed_rl.workers.resharding.layout import InferenceLayout
from mindspeed_rl.workers.resharding.manifest import (
    MANIFEST_NAME,
    ShardEntry,
    SnapshotError,
    SnapshotInfo,
    SnapshotManifest,
    TensorEntry,
)
from mindspeed_rl.workers.resharding.merge import NameMap, Piece, apply_name_map, merge_pieces, split_for_rank
from mindspeed_rl.workers.resharding.shardio import read_shard, write_shard
from mindspeed_rl.workers.resharding.store import (
    DEFAULT_LEASE_TTL_S,
    fsync_path,
    latest_published,
    lease,
    list_published,
    new_temp_dir,
    prune,
    publish_dir,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConvertedWeights:
    """A snapshot rebuilt for one GU: ``per_rank[r]`` is what inference rank r loads."""

    version: int
    per_rank: tuple[dict[str, torch.Tensor], ...]
    read_seconds: float
    merge_seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ConvertResult:
    """Outcome of `GuConverter.convert`; seconds feed the T_convert metric."""

    version: int
    converted: SnapshotInfo
    reused: bool
    read_seconds: float = 0.0
    merge_seconds: float = 0.0
    write_seconds: float = 0.0
    bytes_written: int = 0
    pruned_versions: tuple[int, ...] = field(default_factory=tuple)

    @property
    def total_seconds(self) -> float:
        return self.read_seconds + self.merge_seconds + self.write_seconds


def read_training_pieces(
    snapshot: SnapshotInfo, *, num_threads: int = 4
) -> tuple[SnapshotManifest, list[Piece]]:
    """Every shard of a published training snapshot, verified; raises SnapshotError on any defect."""
    manifest = SnapshotManifest.load(snapshot.path)
    if manifest.version != snapshot.version:
        raise SnapshotError(
            f"{snapshot.path} holds version {manifest.version}, announced as {snapshot.version}"
        )
    layout = manifest.training_layout()
    ranks = sorted(s.rank for s in manifest.shards)
    if ranks != list(range(layout.world_size)):
        raise SnapshotError(
            f"snapshot v{manifest.version}: shards of ranks {ranks}, layout has {layout.world_size}"
        )
    specs = {(t.shard_file, t.name): t.partition for t in manifest.tensors}
    pieces: list[Piece] = []
    for shard in manifest.shards:
        tensors = read_shard(snapshot.path, manifest, shard, num_threads=num_threads)
        for name, tensor in tensors.items():
            pieces.append(
                Piece(name=name, tensor=tensor, spec=specs[(shard.file, name)], coords=shard.coords)
            )
    return manifest, pieces


def convert_snapshot(
    snapshot: SnapshotInfo, layout: InferenceLayout, *, name_map: NameMap | None = None, num_threads: int = 4
) -> ConvertedWeights:
    """Read, verify, merge, rename and repartition a training snapshot in memory."""
    started = time.perf_counter()
    manifest, pieces = read_training_pieces(snapshot, num_threads=num_threads)
    read_done = time.perf_counter()
    training = manifest.training_layout()
    full = merge_pieces(
        apply_name_map(pieces, name_map or NameMap()), tp_size=training.tp_size, ep_size=training.ep_size
    )
    per_rank = tuple(split_for_rank(full, layout, r) for r in range(layout.world_size))
    return ConvertedWeights(
        version=manifest.version,
        per_rank=per_rank,
        read_seconds=read_done - started,
        merge_seconds=time.perf_counter() - read_done,
    )


class GuConverter:
    """Keeps a GU's converted cache: one inference-layout snapshot per training snapshot, newest K kept."""

    def __init__(
        self,
        cache_dir: Path,
        layout: InferenceLayout,
        *,
        name_map: NameMap | None = None,
        keep_last: int = 2,
        num_threads: int = 4,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last}: keep at least the newest converted snapshot (>= 1)")
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.layout = layout
        self.name_map = name_map or NameMap()
        self.keep_last = keep_last
        self.num_threads = num_threads
        self.lease_ttl_s = lease_ttl_s

    def latest(self) -> SnapshotInfo | None:
        return latest_published(self.cache_dir)

    def convert(self, snapshot: SnapshotInfo) -> ConvertResult:
        """Convert ``snapshot`` unless already cached. Raises SnapshotError (logged) if it is defective."""
        for cached in list_published(self.cache_dir):
            if cached.version == snapshot.version:
                return ConvertResult(version=snapshot.version, converted=cached, reused=True)
        try:
            with lease(snapshot):
                weights = convert_snapshot(
                    snapshot, self.layout, name_map=self.name_map, num_threads=self.num_threads
                )
        except SnapshotError:
            logger.exception(
                "snapshot v%d at %s rejected; GU cache unchanged", snapshot.version, snapshot.path
            )
            raise
        write_started = time.perf_counter()
        info, nbytes = self._write(weights)
        write_seconds = time.perf_counter() - write_started
        pruned = prune(self.cache_dir, self.keep_last, self.lease_ttl_s)
        return ConvertResult(
            version=weights.version,
            converted=info,
            reused=False,
            read_seconds=weights.read_seconds,
            merge_seconds=weights.merge_seconds,
            write_seconds=write_seconds,
            bytes_written=nbytes,
            pruned_versions=pruned,
        )

    def _write(self, weights: ConvertedWeights) -> tuple[SnapshotInfo, int]:
        temp = new_temp_dir(self.cache_dir, weights.version)
        shards: list[ShardEntry] = []
        entries: list[TensorEntry] = []
        for rank, tensors in enumerate(weights.per_rank):
            file = f"rank-{rank:05d}.safetensors"
            specs = {name: self.layout.spec_for(name) for name in tensors}
            nbytes, rank_entries = write_shard(temp / file, tensors, specs)
            shards.append(ShardEntry(file=file, rank=rank, coords=self.layout.coords(rank), nbytes=nbytes))
            entries.extend(rank_entries)
        manifest = SnapshotManifest(
            version=weights.version,
            created_unix=time.time(),
            kind="inference",
            layout=self.layout.to_json(),
            shards=tuple(shards),
            tensors=tuple(entries),
        )
        (temp / MANIFEST_NAME).write_text(manifest.dumps())
        fsync_path(temp / MANIFEST_NAME)
        return publish_dir(temp, self.cache_dir, weights.version), manifest.total_bytes()
