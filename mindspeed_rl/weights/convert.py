"""Generation-side conversion, once per GU per snapshot.

::

    identity (training layout == inference layout, names already HF; the torch backend):
    <export root>/v<N>/rank-00000.safetensors ──hard link (same inode, no byte read or written)──┐
                                                                                                  ▼
    <GU cache>/v<N>/rank-00000.safetensors + manifest (kind "inference", the writer's checksums) ◄┘

    otherwise:
    <export root>/v<N>/manifest ──plan on meta tensors (names, shapes, every check)──► output file headers
    then, one group of tensors at a time (a name's TP/EP pieces, or a fused tensor's parts):
    read + verify its pieces ──NameMap──► merge TP/EP ──► split per GU rank ──► write at planned offsets
                                                                                         │
    <GU cache>/v<N>/rank-<r>.safetensors + manifest (kind "inference") ◄── atomic publish ┘

Actors then load only their rank's file from the GU cache (see reload.py).

Host memory of a merge is bounded by its largest group, not by the model: the plan fixes each
output file's header (the same bytes `write_shard` of the whole model writes), so every merged
tensor is written at its offset as soon as its pieces are in and then dropped. A group's pieces
are read straight into the merged tensor where their slice of it is contiguous (column-parallel
splits), so the bytes held at once are about the largest merged tensor plus one piece. Several
groups convert at once on ``num_threads`` threads while their planned bytes together fit the
largest group's.

Which hop verifies what, and why. A checksum is computed exactly once per byte written
(by whoever writes it, from the bytes in flight) and verified by every hop that reads
the bytes anyway; a hop that does not need the bytes does not read them to verify:

- export (TU): CRC-32 per tensor while writing; file sizes; manifest last, atomic publish.
- identity convert: manifest, file sizes, safetensors header (names, dtypes, shapes,
  offsets) against the manifest; no tensor bytes read. The link is the same inode, so the
  cache cannot differ from the export; re-reading 61 GB here would only find what the
  reload finds anyway. The writer's checksums go into the inference manifest unchanged.
  Where the file systems force a copy instead of a link, the copy's size is checked.
- merge convert: reads every byte (it must, to merge) and verifies each tensor's CRC while
  reading. A hop that rewrites bytes must verify its input, or it would launder
  corruption into a fresh, valid-looking checksum. New CRCs are taken while writing. A defect
  found midway leaves only the unpublished temp folder, which is removed.
- reload (actor): reads its rank's bytes and verifies each CRC while reading, before the
  engine is touched: the end-to-end check (disk, network file system, links).

A defective snapshot is rejected by the first hop that can see the defect and never
reaches an engine, so actors keep their weights.

"CRC" above is the manifest's ``checksum_algo``: an export's is CRC-32; a GU cache may write
xxh3_64 (``checksum_algo``; shared_fs's GU does), about 8x faster to take and to verify here,
and a delta's applied copy then hands over the checksums it was checked with (no pass at all).
A cache that writes its files writes each version over a retired version's file
(``store.SpareFiles``): on this host a new 366 MB file cost 0.08-0.9 s, an overwrite 0.04 s.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, TypeVar

import torch

from mindspeed_rl.weights.layout import InferenceLayout
from mindspeed_rl.weights.manifest import (
    CHECKSUM_ALGO,
    MANIFEST_NAME,
    NO_CHECKSUM,
    ShardEntry,
    SnapshotError,
    SnapshotInfo,
    SnapshotManifest,
    TensorEntry,
    format_digest,
)
from mindspeed_rl.weights.merge import (
    NameMap,
    Piece,
)
from mindspeed_rl.weights.shardio import (
    PlannedShard,
    check_shard_file,
    read_shards,
)
from mindspeed_rl.weights.store import (
    DEFAULT_LEASE_TTL_S,
    SpareFiles,
    boot_id,
    fsync_path,
    lease,
    link_or_copy,
    list_published,
    mark_volatile,
    new_temp_dir,
    prune,
    publish_dir,
    retire,
    snapshot_run_id,
    trusted_after_crashes,
)
from mindspeed_rl.weights.streaming_merge import (
    ConversionPlan,
    Sink,
    _Group,
    convert_group_in_memory,
    group_keys,
    plan_conversion,
    run_conversion,
    run_groups_bounded,
)

logger = logging.getLogger(__name__)
_G = TypeVar("_G")

ConvertMethod = Literal["reused", "linked", "copied", "merged", "from_memory"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConvertedWeights:
    """A snapshot rebuilt for one GU: ``per_rank[r]`` is what inference rank r loads."""

    version: int
    per_rank: tuple[dict[str, torch.Tensor], ...]
    read_seconds: float
    merge_seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ConvertResult:
    """Outcome of `GuConverter.convert`; seconds feed the T_convert metric.

    ``method``: "reused" (already cached), "linked" / "copied" (identity layout: the export's
    file hard-linked, or copied across file systems), "merged" (read, merged, rewritten),
    "from_memory" (``convert_tensors``: written from host tensors, merged first if needed).
    Seconds of a merge: ``read_seconds`` the checks and the plan (manifest and headers only),
    ``merge_seconds`` the streamed pass (reading, merging and writing interleave, group by
    group), ``write_seconds`` the fsyncs and the publish.
    """

    version: int
    converted: SnapshotInfo
    reused: bool
    method: ConvertMethod = "merged"
    read_seconds: float = 0.0
    merge_seconds: float = 0.0
    write_seconds: float = 0.0
    bytes_written: int = 0
    pruned_versions: tuple[int, ...] = field(default_factory=tuple)

    @property
    def total_seconds(self) -> float:
        return self.read_seconds + self.merge_seconds + self.write_seconds


def load_training_manifest(snapshot: SnapshotInfo) -> SnapshotManifest:
    """The manifest of a published training snapshot, checked against its announcement and layout."""
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
    return manifest


def is_identity(manifest: SnapshotManifest, layout: InferenceLayout, name_map: NameMap) -> bool:
    """Whether conversion would reproduce the export's one file byte for byte."""
    if manifest.training_layout().naming is not None:
        return False
    if manifest.training_layout().world_size != 1 or len(manifest.shards) != 1 or layout.world_size != 1:
        return False
    for entry in manifest.tensors:
        if name_map.rename(entry.name) != entry.name:
            return False
        if any(re.fullmatch(rule.pattern, entry.name) for rule in name_map.unfuse):
            return False
    return True


def read_training_pieces(
    snapshot: SnapshotInfo, *, num_threads: int | None = None
) -> tuple[SnapshotManifest, list[Piece]]:
    """Every shard of a published training snapshot, verified; raises SnapshotError on any defect."""
    manifest = load_training_manifest(snapshot)
    specs = {(t.shard_file, t.name): t.partition for t in manifest.tensors}
    by_file = read_shards(snapshot.path, manifest, manifest.shards, num_threads=num_threads)
    pieces = [
        Piece(name=name, tensor=tensor, spec=specs[(shard.file, name)], coords=shard.coords)
        for shard in manifest.shards
        for name, tensor in by_file[shard.file].items()
    ]
    return manifest, pieces


def convert_snapshot(
    snapshot: SnapshotInfo,
    layout: InferenceLayout,
    *,
    name_map: NameMap | None = None,
    num_threads: int | None = None,
) -> ConvertedWeights:
    """Read, verify, merge, rename and repartition a training snapshot in memory (the GU's
    converter runs the same plan but writes each tensor to its file instead of keeping it)."""
    started = time.perf_counter()
    manifest = load_training_manifest(snapshot)
    plan = plan_conversion(manifest, layout, name_map=name_map)
    planned = time.perf_counter()
    per_rank: tuple[dict[str, torch.Tensor], ...] = tuple({} for _ in range(layout.world_size))
    lock = threading.Lock()

    def keep(rank: int, name: str, tensor: torch.Tensor) -> None:
        with lock:
            per_rank[rank][name] = tensor

    run_conversion(snapshot.path, plan, layout, keep, num_threads=num_threads)
    return ConvertedWeights(
        version=manifest.version,
        per_rank=per_rank,
        read_seconds=planned - started,
        merge_seconds=time.perf_counter() - planned,
    )


class GuConverter:
    """Keeps a GU's converted cache: one inference-layout snapshot per training snapshot, newest K kept.

    Retention and reuse are per run (the run id recorded in the source manifest): a cached
    snapshot of another run is never reused, and one holding the version needed now is
    replaced (the cache is derived data of this GU).

    ``durable=False``: the cache's files are written without fsync (a merge or a delta's
    applied copy: the full model's bytes, which an fsync pushes through the disk before actors
    may read them, though they read them from the page cache anyway). That is safe because the
    cache is derived data and only a host crash loses unsynced bytes: each such folder records
    the boot it was written in (``store.mark_volatile``), and one of an earlier boot is never
    reused (converted again) nor offered as the latest; actors verify every CRC they load.
    """

    def __init__(
        self,
        cache_dir: Path,
        layout: InferenceLayout,
        *,
        name_map: NameMap | None = None,
        keep_last: int = 2,
        num_threads: int | None = None,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        durable: bool = True,
        checksum_algo: str = CHECKSUM_ALGO,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last}: keep at least the newest converted snapshot (>= 1)")
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.layout = layout
        self.name_map = name_map
        """None: each snapshot's own naming (its manifest layout), identity for HF names."""
        self.keep_last = keep_last
        self.num_threads = num_threads
        self.lease_ttl_s = lease_ttl_s
        self.durable = durable or boot_id() is None  # no boot id: nothing to tell a crash by
        format_digest(checksum_algo, 0)  # an unknown algorithm raises here
        self.checksum_algo = checksum_algo
        """What the files this converter writes are checksummed with (a link keeps its source's)."""
        self.spare = SpareFiles(self.cache_dir, max_files=layout.world_size)
        """Retired versions' files, written over by the next conversion (``store.SpareFiles``):
        kept only once this converter writes files (a merge, a delta's applied copy); a cache of
        hard links keeps none, it would never write over them."""
        self._writes = False

    def latest(self) -> SnapshotInfo | None:
        trusted = [c for c in list_published(self.cache_dir) if trusted_after_crashes(c.path)]
        return trusted[-1] if trusted else None

    def convert(self, snapshot: SnapshotInfo) -> ConvertResult:
        """Convert ``snapshot`` unless already cached. Raises SnapshotError (logged) if it is defective."""
        try:
            with lease(snapshot):
                source = load_training_manifest(snapshot)
                cached = self._cached(source)
                if cached is not None:
                    return ConvertResult(
                        version=source.version, converted=cached, reused=True, method="reused"
                    )
                if is_identity(source, self.layout, self.name_map or NameMap()):
                    result = self._link(snapshot, source)
                else:
                    result = self._merge(snapshot, source)
        except SnapshotError:
            logger.exception(
                "snapshot v%d at %s rejected; GU cache unchanged", snapshot.version, snapshot.path
            )
            raise
        pruned = prune(
            self.cache_dir, self.keep_last, self.lease_ttl_s, run_id=source.run_id, spare=self._spare()
        )
        return replace(result, pruned_versions=pruned)

    def _spare(self) -> SpareFiles | None:
        return self.spare if self._writes else None

    def _cached(self, source: SnapshotManifest) -> SnapshotInfo | None:
        for cached in list_published(self.cache_dir):
            if cached.version != source.version:
                continue
            if not trusted_after_crashes(cached.path):
                logger.warning(
                    "GU cache %s: v%d was written without fsync before the host restarted; "
                    "converting it again",
                    self.cache_dir,
                    cached.version,
                )
                retire(cached)
                continue
            owner = snapshot_run_id(cached.path)
            if owner == source.run_id:
                return cached
            logger.warning(
                "GU cache %s holds v%d of run %r, not of run %r; replacing it",
                self.cache_dir,
                cached.version,
                owner,
                source.run_id,
            )
            retire(cached)
        return None

    def _link(self, snapshot: SnapshotInfo, source: SnapshotManifest) -> ConvertResult:
        started = time.perf_counter()
        shard = source.shards[0]
        check_shard_file(snapshot.path / shard.file, source, shard)
        checked = time.perf_counter()
        temp = new_temp_dir(self.cache_dir, source.version)
        file = _rank_file(0)
        linked = link_or_copy(snapshot.path / shard.file, temp / file)
        if (temp / file).stat().st_size != shard.nbytes:
            raise SnapshotError(f"{temp / file}: copy of {snapshot.path / shard.file} has the wrong size")
        entries = tuple(
            replace(t, shard_file=file, partition=self.layout.spec_for(t.name)) for t in source.tensors
        )
        shards = (ShardEntry(file=file, rank=0, coords=self.layout.coords(0), nbytes=shard.nbytes),)
        info = self._publish(temp, source, shards, entries, source.checksum_algo)
        return ConvertResult(
            version=source.version,
            converted=info,
            reused=False,
            method="linked" if linked else "copied",
            read_seconds=checked - started,
            write_seconds=time.perf_counter() - checked,
            bytes_written=0 if linked else shard.nbytes,
        )

    def _merge(self, snapshot: SnapshotInfo, source: SnapshotManifest) -> ConvertResult:
        def feed(plan: ConversionPlan, writers: list[PlannedShard]) -> None:
            run_conversion(snapshot.path, plan, self.layout, _sink(writers), num_threads=self.num_threads)

        return self._write_plan(source, feed, method="merged")

    def convert_tensors(
        self, source: SnapshotManifest, tensors: Mapping[tuple[str, str], torch.Tensor]
    ) -> ConvertResult:
        """Convert a training snapshot that is already in host memory (``weight_delta``'s applied
        copy, keyed by ``(shard file, name)`` as ``source`` lists them) into this cache: the same
        plan and writers as a merge, fed from memory, so no training snapshot is written and read
        back first. ``source``'s checksums must be those of ``tensors`` (the caller checked them):
        an identity layout's file records them without a second CRC pass (an entry without one,
        ``NO_CHECKSUM``: the CRC is taken while writing, as for a merge)."""
        cached = self._cached(source)
        if cached is not None:
            return ConvertResult(version=source.version, converted=cached, reused=True, method="reused")
        identity = is_identity(source, self.layout, self.name_map or NameMap())
        same_algo = source.checksum_algo == self.checksum_algo
        checked = {
            (e.shard_file, e.name): e.checksum if same_algo and e.checksum != NO_CHECKSUM else None
            for e in source.tensors
        }

        def feed(plan: ConversionPlan, writers: list[PlannedShard]) -> None:
            if identity:  # one file of the same bytes: each written as it is, its checksum known

                def work(group: _Group) -> None:
                    for key in group_keys(group):
                        writers[0].write(key[1], tensors[key], checksum=checked[key])

            else:

                def work(group: _Group) -> None:
                    convert_group_in_memory(group, plan, tensors, self.layout, _sink(writers))

            run_groups_bounded(plan, work, self.num_threads)

        result = self._write_plan(source, feed, method="from_memory")
        pruned = prune(
            self.cache_dir, self.keep_last, self.lease_ttl_s, run_id=source.run_id, spare=self._spare()
        )
        return replace(result, pruned_versions=pruned)

    def _write_plan(
        self,
        source: SnapshotManifest,
        feed: Callable[[ConversionPlan, list[PlannedShard]], None],
        *,
        method: ConvertMethod,
    ) -> ConvertResult:
        started = time.perf_counter()
        self._writes = True
        plan = plan_conversion(source, self.layout, name_map=self.name_map)
        planned = time.perf_counter()
        temp = new_temp_dir(self.cache_dir, source.version)
        files = [_rank_file(rank) for rank in range(self.layout.world_size)]
        writers: list[PlannedShard] = []
        try:
            for file, tensors in zip(files, plan.per_rank, strict=True):
                specs = {name: self.layout.spec_for(name) for name in tensors}
                nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
                recycled = self.spare.take(temp / file, nbytes)
                writers.append(
                    PlannedShard(
                        temp / file, tensors, specs, overwrite=recycled, checksum_algo=self.checksum_algo
                    )
                )
            feed(plan, writers)
            converted = time.perf_counter()
            shards: list[ShardEntry] = []
            entries: list[TensorEntry] = []
            for rank, (file, writer) in enumerate(zip(files, writers, strict=True)):
                nbytes, rank_entries = writer.finish(durable=self.durable)
                shards.append(
                    ShardEntry(file=file, rank=rank, coords=self.layout.coords(rank), nbytes=nbytes)
                )
                entries.extend(rank_entries)
            info = self._publish(temp, source, tuple(shards), tuple(entries), self.checksum_algo)
        except BaseException:
            for writer in writers:
                writer.close()
            shutil.rmtree(temp, ignore_errors=True)
            raise
        return ConvertResult(
            version=source.version,
            converted=info,
            reused=False,
            method=method,
            read_seconds=planned - started,
            merge_seconds=converted - planned,
            write_seconds=time.perf_counter() - converted,
            bytes_written=sum(s.nbytes for s in shards),
        )

    def _publish(
        self,
        temp: Path,
        source: SnapshotManifest,
        shards: tuple[ShardEntry, ...],
        entries: tuple[TensorEntry, ...],
        checksum_algo: str,
    ) -> SnapshotInfo:
        manifest = SnapshotManifest(
            version=source.version,
            created_unix=time.time(),
            kind="inference",
            layout=self.layout.to_json(),
            shards=shards,
            tensors=entries,
            run_id=source.run_id,
            checksum_algo=checksum_algo,
        )
        if not self.durable:
            mark_volatile(temp)
        (temp / MANIFEST_NAME).write_text(manifest.dumps())
        if self.durable:
            fsync_path(temp / MANIFEST_NAME)
        return publish_dir(temp, self.cache_dir, source.version, durable=self.durable)


def _sink(writers: list[PlannedShard]) -> Sink:
    return lambda rank, name, tensor: writers[rank].write(name, tensor)


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.safetensors"
