"""The snapshot manifest: what a published (or converted) snapshot must contain.

A snapshot directory holds one safetensors file per shard plus ``manifest.json``.
The manifest is the only thing a reader trusts: every file size, tensor shape,
dtype and checksum is checked against it before any weight reaches an engine.

Checksum choice (measured on this machine, 50 MB fp32 buffer): zlib.crc32
2.4 GB/s, sha1 1.6 GB/s, blake2b 0.7 GB/s, md5 0.6 GB/s. The threat is disk or
transfer corruption and truncation, not an adversary, so CRC-32 per tensor is
enough and keeps verification well below the cost of reading the bytes.

What a reader checks, all of it recorded here: each shard file's size (``ShardEntry.nbytes``:
truncation), its safetensors header field by field (names, dtypes, shapes, byte ranges) against
the ``TensorEntry`` list, and each tensor's ``checksum``: the CRC-32 (or xxh3_64, as
``checksum_algo`` names) of its raw bytes, the file's ``data_offsets`` range; so every byte a loader uses is checked. A CRC
is a running value: a reader may take it over any chunking of the bytes and keep none of them
(``shardio.verify_shard``).

No torch import: the Control Unit and tools read manifests without it.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mindspeed_rl.weights.format import SNAPSHOT_FORMAT_VERSION
from mindspeed_rl.weights.layout import PartitionSpec, RankCoords, TrainingLayout

# The manifest's schema is the snapshot format (weights/format.py): one number for every carrier.
SCHEMA_VERSION = SNAPSHOT_FORMAT_VERSION
MANIFEST_NAME = "manifest.json"
CHECKSUM_ALGO = "crc32"
"""What an export checksums its tensors with (every reader verifies with the manifest's own)."""
CHECKSUM_ALGOS = ("crc32", "xxh3_64")
"""What a manifest may name: xxh3_64 (``xxhash``) for a GU's cache, which is derived data written
again every refresh (``GuConverter(checksum_algo=...)``): 26-31 GB/s here against crc32's
3.2-3.6 GB/s, and a delta's applied copy already carries each tensor's xxh3_64."""
NO_CHECKSUM = "none"
"""``TensorEntry.checksum`` where none was taken: a memory snapshot (``memory_snapshot``), or a
delta's applied copy checked with another checksum (``delta_fs``; the converter takes the CRC-32
while writing it)."""
_CRC_CHUNK = 64 * 1024 * 1024

SnapshotKind = Literal["training", "inference"]


def checksum_bytes(data: memoryview) -> str:
    """CRC-32 of a byte buffer as 8 hex digits; chunked so huge tensors never need a copy."""
    crc = 0
    for start in range(0, len(data), _CRC_CHUNK):
        crc = zlib.crc32(data[start : start + _CRC_CHUNK], crc)
    return format_checksum(crc)


def format_checksum(crc: int) -> str:
    """The manifest's spelling of a running CRC-32 value."""
    return f"{crc:08x}"


def format_digest(algo: str, value: int) -> str:
    """The manifest's spelling of a checksum of ``algo`` (8 hex digits for crc32, 16 for xxh3_64)."""
    if algo not in CHECKSUM_ALGOS:
        raise ValueError(f"checksum {algo!r} is unknown; manifests know {CHECKSUM_ALGOS}")
    return format_checksum(value) if algo == "crc32" else f"{value:016x}"


class SnapshotError(ValueError):
    """A snapshot failed validation (missing, truncated, corrupted or inconsistent): never load it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str
    shard_file: str
    nbytes: int
    checksum: str
    partition: PartitionSpec

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "shard_file": self.shard_file,
            "nbytes": self.nbytes,
            "checksum": self.checksum,
            "partition": self.partition.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorEntry:
        return cls(
            name=data["name"],
            shape=tuple(int(d) for d in data["shape"]),
            dtype=data["dtype"],
            shard_file=data["shard_file"],
            nbytes=int(data["nbytes"]),
            checksum=data["checksum"],
            partition=PartitionSpec.from_json(data["partition"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardEntry:
    """One file of the snapshot, written by one (training or inference) rank."""

    file: str
    rank: int
    coords: RankCoords
    nbytes: int

    def to_json(self) -> dict[str, Any]:
        c = self.coords
        return {
            "file": self.file,
            "rank": self.rank,
            "coords": {"tp_rank": c.tp_rank, "ep_rank": c.ep_rank, "pp_rank": c.pp_rank},
            "nbytes": self.nbytes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardEntry:
        return cls(
            file=data["file"],
            rank=int(data["rank"]),
            coords=RankCoords(**data["coords"]),
            nbytes=int(data["nbytes"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotManifest:
    """``kind`` is "training" for a TU export, "inference" for a GU-converted snapshot.

    ``layout`` is the JSON form of the TrainingLayout / InferenceLayout that
    produced the shards. ``run_id`` names the run whose trainer produced the
    weights (a converted snapshot keeps its source's): retention only ever
    counts and deletes snapshots of its own run (see store.prune). Manifests
    written before the field existed read as ``None`` (owned by no run).
    """

    version: int
    created_unix: float
    kind: SnapshotKind
    layout: dict[str, Any]
    shards: tuple[ShardEntry, ...]
    tensors: tuple[TensorEntry, ...]
    run_id: str | None = None
    checksum_algo: str = CHECKSUM_ALGO
    schema_version: int = SCHEMA_VERSION

    def training_layout(self) -> TrainingLayout:
        if self.kind != "training":
            raise ValueError(
                f"snapshot v{self.version} is a {self.kind!r} snapshot; it has no training layout"
            )
        return TrainingLayout.from_json(self.layout)

    def shard(self, rank: int) -> ShardEntry:
        for entry in self.shards:
            if entry.rank == rank:
                return entry
        ranks = sorted(s.rank for s in self.shards)
        raise SnapshotError(f"snapshot v{self.version} has no shard for rank {rank} (ranks present: {ranks})")

    def tensors_in(self, shard_file: str) -> tuple[TensorEntry, ...]:
        return tuple(t for t in self.tensors if t.shard_file == shard_file)

    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "version": self.version,
            "created_unix": self.created_unix,
            "kind": self.kind,
            "run_id": self.run_id,
            "checksum_algo": self.checksum_algo,
            "layout": self.layout,
            "shards": [s.to_json() for s in self.shards],
            "tensors": [t.to_json() for t in self.tensors],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SnapshotManifest:
        schema = data.get("schema_version")
        if schema != SCHEMA_VERSION:
            raise SnapshotError(
                f"manifest schema_version {schema!r} is not supported (this code reads {SCHEMA_VERSION}); "
                "re-export the snapshot with this version of mindspeed_rl"
            )
        algo = data["checksum_algo"]
        if algo not in CHECKSUM_ALGOS:
            raise SnapshotError(
                f"manifest checksum_algo {algo!r} is unknown; expected one of {CHECKSUM_ALGOS}"
            )
        kind = data["kind"]
        if kind not in ("training", "inference"):
            raise SnapshotError(f"manifest kind {kind!r} must be 'training' or 'inference'")
        return cls(
            version=int(data["version"]),
            created_unix=float(data["created_unix"]),
            kind=kind,
            layout=dict(data["layout"]),
            shards=tuple(ShardEntry.from_json(s) for s in data["shards"]),
            tensors=tuple(TensorEntry.from_json(t) for t in data["tensors"]),
            run_id=data.get("run_id"),
            checksum_algo=algo,
            schema_version=schema,
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True)

    @classmethod
    def load(cls, snapshot_dir: Path) -> SnapshotManifest:
        """Read ``manifest.json``; a missing or malformed manifest is a ValueError naming the directory."""
        path = Path(snapshot_dir) / MANIFEST_NAME
        try:
            text = path.read_text()
        except FileNotFoundError as err:
            raise SnapshotError(
                f"snapshot {snapshot_dir} has no {MANIFEST_NAME}; it is incomplete, do not load it"
            ) from err
        try:
            return cls.from_json(json.loads(text))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise SnapshotError(f"{path} is malformed ({err}); re-export the snapshot") from err


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotInfo:
    """A published snapshot as the CU announces it to GUs: its version and directory."""

    version: int
    path: Path
