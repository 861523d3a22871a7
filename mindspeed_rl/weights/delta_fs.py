"""Delta sync on ``weight_transport: shared_fs`` (``async_config.weight_delta: auto | on``).

::

    TU rank r (DeltaSnapshotWriter, writer thread)         GU g (DeltaSharedFsGu.convert(v, path))
    ─────────────────────────────────────────────         ─────────────────────────────────────────
    read .delta-bases/gu-*.json: a GU asking for a full    per rank r: walk back from v<N>/rank-r.delta
      (holds None, a request not yet honoured by r)?         along each file's base until the version
    encode v against r's last encoded version              r's host copy holds, or a full one (each
      (full: first, asked for, every                         folder leased while read); none found:
       delta_full_interval, auto over the threshold)         ask for a full (report below), reject v
    v<N>/rank-r.delta  (delta_wire.pack) + manifest          apply oldest first (DeltaReceiver: xxh3_64 of
      published and pruned as a full snapshot is            every tensor; a mismatch names tensor and
      (same staging claim, same retention)                  version, drops r's copy, asks for a full)
                                                           write the applied copy as a local training
                                                             snapshot (<cache>-applied/v<N>), convert it
                                                             as today (link or TP/PP/EP merge)
                              ◄──── .delta-bases/gu-<g>.json (DeltaBaseReport: holds v | None) ────

Why the report is a file in the snapshot root: shared_fs already requires every GU to see that
folder (the start-up probe checks it), so the ask needs no new channel through the Control Unit;
and each delta names its base, so a GU that skipped versions catches up along the chain of
published deltas (``snapshot_keep`` of them) instead of asking: nothing is guessed. A TU that
starts (a new run or a resume) has no base: its first export is full, so every GU's base is
re-established; a GU that restarts holds nothing and walks back to the newest full or asks.
Actors are untouched: they load the GU's converted folder, a full copy, as with ``off``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from mindspeed_rl.weights.delta import (
    BaseMismatch,
    DeltaEncoder,
    DeltaMismatch,
    DeltaReceiver,
    DeltaRefresh,
    DeltaStats,
)
from mindspeed_rl.weights.delta_wire import pack, unpack
from mindspeed_rl.weights.export import (
    SnapshotWriter,
    _Prepared,
    _write_rank_record,
    export_result,
    staging_dirname,
)
from mindspeed_rl.weights.export_queue import Pending
from mindspeed_rl.weights.layout import TrainingLayout
from mindspeed_rl.weights.manifest import (
    CHECKSUM_ALGO,
    CHECKSUM_ALGOS,
    NO_CHECKSUM,
    ShardEntry,
    SnapshotError,
    SnapshotInfo,
    SnapshotManifest,
    TensorEntry,
    format_digest,
)
from mindspeed_rl.weights.shardio import dtype_name
from mindspeed_rl.weights.store import (
    fsync_path,
    lease,
    prune,
    snapshot_dirname,
)
from mindspeed_rl.weights.transports.base import DeltaSettings

logger = logging.getLogger(__name__)
_R = TypeVar("_R")

REPORTS_DIR = ".delta-bases"
"""Under the TU's snapshot root: one ``DeltaBaseReport`` per GU."""
DELTA_SUFFIX = ".delta"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeltaBaseReport:
    """What a GU's host copy holds, as the TU reads it. ``holds`` None = nothing usable: the GU
    asks for a full snapshot; ``full_requests`` counts its asks (each rank honours one once)."""

    gu_id: int
    holds: int | None
    full_requests: int

    def to_json(self) -> dict[str, Any]:
        return {"gu_id": self.gu_id, "holds": self.holds, "full_requests": self.full_requests}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeltaBaseReport:
        holds = data["holds"]
        return cls(
            gu_id=int(data["gu_id"]),
            holds=None if holds is None else int(holds),
            full_requests=int(data["full_requests"]),
        )


def report_path(root: Path, gu_id: int) -> Path:
    return Path(root) / REPORTS_DIR / f"gu-{gu_id}.json"


def read_reports(root: Path) -> list[DeltaBaseReport]:
    folder = Path(root) / REPORTS_DIR
    if not folder.is_dir():
        return []
    reports = []
    for path in sorted(folder.glob("gu-*.json")):
        try:
            reports.append(DeltaBaseReport.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError) as err:  # being replaced right now: read next time
            logger.warning("delta base report %s unreadable (%s); read again at the next export", path, err)
    return reports


def write_report(root: Path, report: DeltaBaseReport) -> None:
    path = report_path(root, report.gu_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.part")
    tmp.write_text(json.dumps(report.to_json()))
    os.replace(tmp, path)  # the TU never reads half a report


def delta_file(rank: int) -> str:
    return f"rank-{rank:05d}{DELTA_SUFFIX}"


class DeltaSnapshotWriter(SnapshotWriter):
    """``SnapshotWriter`` whose shards are ``delta_wire.pack``-ed refreshes (full or sparse).

    Encoding happens on the writer thread, in version order, and only for exports that were
    not superseded: an encoder's base is always the last version this rank wrote."""

    _closed_hint = "create a new writer"

    def __init__(
        self, root_dir: Path, *, settings: DeltaSettings, keep_last: int = 2, run_id: str | None = None
    ) -> None:
        DeltaEncoder(settings.mode, full_interval=settings.full_interval)  # bad settings raise here
        self.settings = settings
        self._encoders: dict[int, DeltaEncoder] = {}
        self._honoured: dict[int, dict[int, int]] = {}
        """rank -> gu_id -> the last ``full_requests`` count this rank answered with a full."""
        self.delta_stats = DeltaStats()
        super().__init__(root_dir, keep_last=keep_last, run_id=run_id)

    def stats(self) -> dict[str, float]:
        """summary.json: the TU's totals (bytes written per refresh against the full bytes)."""
        return self.delta_stats.as_summary()

    def _reuse(self, rank: int, chosen: list[tuple[str, torch.Tensor]]) -> Mapping[str, torch.Tensor] | None:
        """The base this rank's encoder let go (``DeltaEncoder.take_spare``)."""
        encoder = self._encoders.get(rank)
        return None if encoder is None else encoder.take_spare(chosen)

    def _full_asked(self, rank: int) -> bool:
        honoured = self._honoured.setdefault(rank, {})
        asked = False
        for report in read_reports(self.root_dir):
            if report.holds is None and report.full_requests > honoured.get(report.gu_id, 0):
                honoured[report.gu_id] = report.full_requests
                asked = True
        return asked

    def _publish(self, pending: Pending[_Prepared]) -> Any:
        prep = pending.payload
        assert prep is not None
        write_started = time.perf_counter()
        encoder = self._encoders.setdefault(
            pending.rank, DeltaEncoder(self.settings.mode, full_interval=self.settings.full_interval)
        )
        base = None if self._full_asked(pending.rank) else encoder.base_version
        # prep.tensors are the export's own host copies (export._prepare): the encoder keeps them.
        refresh = encoder.encode(pending.version, prep.tensors.items(), base, owned=True)
        self.delta_stats.record(refresh, 0.0)
        buffer = pack(refresh)
        staging = self.root_dir / staging_dirname(pending.version)
        staging.mkdir(exist_ok=True)
        name = delta_file(pending.rank)
        partial = staging / f"{name}.part"
        partial.write_bytes(buffer)
        fsync_path(partial)
        os.replace(partial, staging / name)
        shard = ShardEntry(file=name, rank=pending.rank, coords=prep.coords, nbytes=len(buffer))
        _write_rank_record(staging, shard, ())
        published = self._publish_if_complete(staging, pending)
        pruned = (
            prune(self.root_dir, self.keep_last, self.lease_ttl_s, run_id=self.run_id) if published else ()
        )
        return export_result(
            pending,
            bytes_written=len(buffer),
            save_seconds=time.perf_counter() - pending.started,
            published=published,
            pruned=pruned,
            write_seconds=time.perf_counter() - write_started,
        )


class _ChainBroken(SnapshotError):
    """No published chain of deltas leads from what a rank's copy holds to the version asked."""


class DeltaApplier:
    """A GU's host copies (one ``DeltaReceiver`` per TU rank) of the newest applied version,
    handed to the converter from memory (``GuConverter.convert_tensors``): no training snapshot
    is written and read back on the GU."""

    def __init__(self, gu_id: int) -> None:
        self.gu_id = gu_id
        self.receivers: dict[int, DeltaReceiver] = {}
        self._lock = threading.Lock()
        self.stats = DeltaStats()
        self.last: dict[str, float] = {}
        """The last applied version's figures, summed over ranks (metrics.jsonl)."""

    def apply(self, version: int, path: Path, convert: Callable[[Applied], _R]) -> _R:
        """Bring every rank's copy to ``version`` (published at ``path``), then ``convert`` it
        while the copies cannot change. Raises ``SnapshotError`` (after asking the TU for a full
        snapshot) when a chain is broken or a checksum differs."""
        with self._lock:  # the copies are advanced, and converted, by one conversion at a time
            return convert(self._apply(version, path))

    def _apply(self, version: int, path: Path) -> Applied:
        root = Path(path).parent
        manifest = SnapshotManifest.load(path)
        if manifest.version != version:
            raise SnapshotError(f"{path} holds v{manifest.version}, not v{version}")
        sent = applied = changed = total = 0
        encode_s = apply_s = 0.0
        try:
            for shard in manifest.shards:
                receiver = self.receivers.setdefault(shard.rank, DeltaReceiver())
                for refresh in self._chain(root, version, shard.rank, receiver.base_version):
                    seconds = receiver.apply(refresh)
                    self.stats.record(refresh, seconds)
                    applied += 1
                    sent += refresh.nbytes
                    changed += refresh.changed_elements
                    total += refresh.total_elements
                    encode_s += refresh.encode_seconds
                    apply_s += seconds
                if receiver.base_version != version:
                    raise AssertionError(f"rank {shard.rank} holds v{receiver.base_version} after its chain")
        except (DeltaMismatch, BaseMismatch, _ChainBroken) as err:
            logger.error("GU %d: %s; asking the trainer for a full snapshot", self.gu_id, err)
            self.stats.resends += 1
            self.ask_full(root)
            raise
        self.last = {
            "delta_bytes_sent": float(sent),
            "delta_changed_fraction": changed / max(total, 1),
            "delta_encode_seconds": encode_s,
            "delta_apply_seconds": apply_s,
            "delta_refreshes_applied": float(applied),
        }
        write_report(root, DeltaBaseReport(gu_id=self.gu_id, holds=version, full_requests=self._asked(root)))
        # Only this snapshot's ranks: a copy of a rank the layout no longer has is not converted.
        return applied_snapshot(
            version,
            manifest.training_layout(),
            manifest.run_id,
            {shard.rank: self.receivers[shard.rank] for shard in manifest.shards},
        )

    def ask_full(self, root: Path) -> None:
        write_report(root, DeltaBaseReport(gu_id=self.gu_id, holds=None, full_requests=self._asked(root) + 1))

    def _asked(self, root: Path) -> int:
        # From the report itself, so a restarted GU's next ask still counts as a new one.
        for report in read_reports(root):
            if report.gu_id == self.gu_id:
                return report.full_requests
        return 0

    def _chain(self, root: Path, version: int, rank: int, holds: int | None) -> list[DeltaRefresh]:
        """The refreshes of ``rank`` to apply, oldest first: back from ``version`` along each one's
        base until the one built on ``holds`` or a full one."""
        if holds == version:  # converted again (a retry): the copy is already there
            return []
        chain: list[DeltaRefresh] = []
        at: int | None = version
        with contextlib.ExitStack() as leases:
            while True:
                assert at is not None
                folder = root / snapshot_dirname(at)
                try:
                    leases.enter_context(lease(SnapshotInfo(version=at, path=folder)))
                    refresh = unpack((folder / delta_file(rank)).read_bytes())
                except (OSError, ValueError) as err:
                    raise _ChainBroken(
                        f"weight delta v{version}, rank {rank}: v{at} is needed on the way from "
                        f"{'nothing' if holds is None else f'v{holds}'} but cannot be read ({err})"
                    ) from err
                if refresh.version != at:
                    raise _ChainBroken(f"{folder / delta_file(rank)} holds v{refresh.version}, not v{at}")
                chain.append(refresh)
                if refresh.is_full or refresh.base_version == holds:
                    return chain[::-1]
                at = refresh.base_version


def _manifest_checksum(algo: str, value: int, manifest_algo: str) -> str:
    """The checksum each tensor was checked with when applied, in the manifest's spelling; none
    (``NO_CHECKSUM``) where it is not the manifest's algorithm: the converter then takes one
    while writing (``GuConverter.convert_tensors``)."""
    return format_digest(algo, value) if algo == manifest_algo else NO_CHECKSUM


@dataclass(frozen=True, slots=True, kw_only=True)
class Applied:
    """An applied version in host memory: the training manifest a full export of it would have
    (its checksums the trainer's, checked when applied) and its tensors keyed as the converter
    reads them, ``(shard file, name)``. Views of the GU's copies: valid until the next apply."""

    manifest: SnapshotManifest
    tensors: dict[tuple[str, str], torch.Tensor]


def applied_snapshot(
    version: int, layout: TrainingLayout, run_id: str | None, per_rank: Mapping[int, DeltaReceiver]
) -> Applied:
    shards: list[ShardEntry] = []
    entries: list[TensorEntry] = []
    tensors: dict[tuple[str, str], torch.Tensor] = {}
    # The delta's own checksum (xxh3_64) where every tensor has it: a converter writing xxh3_64
    # files records them without another pass (shared_fs's GU); one writing CRC-32s takes them.
    algos = {algo for r in per_rank.values() for algo, _ in r.checksums().values()}
    manifest_algo = algos.pop() if len(algos) == 1 and algos <= set(CHECKSUM_ALGOS) else CHECKSUM_ALGO
    for rank in sorted(per_rank):
        file = f"rank-{rank:05d}.safetensors"
        checksums = per_rank[rank].checksums()
        nbytes = 0
        for name, tensor in per_rank[rank].tensors().items():
            size = tensor.numel() * tensor.element_size()
            nbytes += size
            tensors[(file, name)] = tensor
            entries.append(
                TensorEntry(
                    name=name,
                    shape=tuple(tensor.shape),
                    dtype=dtype_name(tensor.dtype),
                    shard_file=file,
                    nbytes=size,
                    checksum=_manifest_checksum(*checksums[name], manifest_algo),
                    partition=layout.spec_for(name),
                )
            )
        shards.append(ShardEntry(file=file, rank=rank, coords=layout.coords(rank), nbytes=nbytes))
    manifest = SnapshotManifest(
        version=version,
        created_unix=time.time(),
        kind="training",
        layout=layout.to_json(),
        shards=tuple(shards),
        tensors=tuple(entries),
        run_id=run_id,
        checksum_algo=manifest_algo,
    )
    return Applied(manifest=manifest, tensors=tensors)
