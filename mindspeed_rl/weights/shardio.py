"""Write one shard file, and read one back verified against the manifest, at disk speed.

Files are standard safetensors (8-byte header length, JSON header, raw bytes), so any
safetensors reader (vLLM's ``weights_path`` loader included) opens them. We write and read
them ourselves because the library's torch writer first copies every tensor into a Python
``bytes`` object, and because we want the checksum taken from the bytes in flight:

- write: each tensor's memory goes to the file in chunks with ``os.pwrite`` at its final
  offset; the CRC-32 of a chunk is taken just before it is written, while it is in cache.
  The checksum is therefore computed once, from the exact bytes written, never by re-reading.
- read: each tensor is read with ``os.preadv`` straight into its (preallocated) torch
  storage, and its CRC-32 (or the xxh3_64 its manifest names) is taken chunk by chunk as it
  arrives.
- verify: the same reads and checks into one reused chunk buffer per thread, keeping nothing
  (``verify_shard``): host memory is ``threads x 8 MiB`` whatever the file size. For a reader
  that only needs to know the file is sound because another process loads it (a TP > 1 vLLM
  engine's workers read the folder themselves).
- planned write (``PlannedShard``): the header is laid out from shapes and dtypes alone (meta
  tensors will do), then tensors are written at their final offsets in any order as they are
  produced, so a converter never holds the whole file's tensors at once.

Both sides bin tensors by size across a thread pool (big tensors end up alone in a bin,
small ones grouped, the same idea as the paper's H2D streams). ``pwrite``/``preadv`` and
``zlib.crc32`` release the GIL, so the threads overlap on separate cores and disk queues.

Which hop verifies what (and why) is stated in convert.py's module docstring.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import xxhash

from mindspeed_rl.weights.layout import PartitionSpec
from mindspeed_rl.weights.manifest import (
    CHECKSUM_ALGO,
    ShardEntry,
    SnapshotError,
    SnapshotManifest,
    TensorEntry,
    format_digest,
)

# 8 MiB: small enough that a chunk is still in cache when it is written after its CRC.
_CHUNK = 8 * 1024 * 1024
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit
_ST_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
}
_TORCH_DTYPES = {code: dtype for dtype, code in _ST_DTYPES.items()}
_BY_NAME = {str(dtype).removeprefix("torch."): dtype for dtype in _ST_DTYPES}
_T = TypeVar("_T")
_R = TypeVar("_R")


def default_io_threads() -> int:
    """Threads for one shard's I/O: one per core, at least 2 (a disk queue overlaps CRC), at most 8."""
    return min(8, max(2, os.cpu_count() or 1))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a manifest dtype name (``dtype_name``'s inverse)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise SnapshotError(f"dtype {name!r} is not one snapshots hold ({sorted(_BY_NAME)})") from None


def _crc_update(chunk: memoryview, crc: int) -> int:
    """One CRC-32 step; a named function so tests can count the bytes checksummed."""
    return zlib.crc32(chunk, crc)


def _xxh3_update(chunk: memoryview, state: Any) -> Any:
    """One xxh3_64 step (``state``: an ``xxhash.xxh3_64``); named as ``_crc_update`` is."""
    state.update(chunk)
    return state


class _Digest:
    """A running checksum of the manifest's ``checksum_algo``, fed chunk by chunk."""

    __slots__ = ("algo", "state")

    def __init__(self, algo: str) -> None:
        self.algo = algo
        self.state: Any = 0 if algo == "crc32" else xxhash.xxh3_64()
        format_digest(algo, 0)  # an unknown algorithm raises here

    def update(self, chunk: memoryview) -> None:
        if self.algo == "crc32":
            self.state = _crc_update(chunk, self.state)
        else:
            self.state = _xxh3_update(chunk, self.state)

    def hexdigest(self) -> str:
        value = self.state if self.algo == "crc32" else self.state.intdigest()
        return format_digest(self.algo, value)


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    """A tensor's bytes without a copy (a contiguous CPU tensor of any dtype)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data.cast("B")


@dataclass(frozen=True, slots=True)
class _Placed:
    name: str
    tensor: torch.Tensor
    offset: int  # absolute position in the file
    nbytes: int


def write_shard(
    path: Path,
    tensors: Mapping[str, torch.Tensor],
    specs: Mapping[str, PartitionSpec],
    *,
    shard_file: str | None = None,
    num_threads: int | None = None,
) -> tuple[int, tuple[TensorEntry, ...]]:
    """Write ``tensors`` to ``path`` (fsynced); return the file size and one manifest entry per tensor.

    ``shard_file`` is the name recorded in the entries when ``path`` is a temporary name.
    """
    for name, tensor in tensors.items():
        _check_writable(name, tensor)
    shard = PlannedShard(path, tensors, specs, shard_file=shard_file)
    try:
        run_in_bins(shard.placed, lambda p: p.nbytes, lambda p: shard.write(p.name, p.tensor), num_threads)
        return shard.finish()
    finally:
        shard.close()


def _check_writable(name: str, tensor: torch.Tensor) -> None:
    if tensor.device.type != "cpu" or tensor.dtype not in _ST_DTYPES:
        raise ValueError(
            f"{name}: a {tensor.dtype} tensor on {tensor.device} cannot be written; "
            "pass CPU tensors of a safetensors dtype"
        )


class PlannedShard:
    """One shard file whose layout is fixed up front; tensors are written at their offsets later.

    ``planned`` gives every tensor's name, shape and dtype (meta tensors are enough); the file is
    byte for byte what `write_shard` of the real tensors writes. `write` may be called from several
    threads, once per name, in any order; `finish` fsyncs and returns what `write_shard` returns.
    """

    def __init__(
        self,
        path: Path,
        planned: Mapping[str, torch.Tensor],
        specs: Mapping[str, PartitionSpec],
        *,
        shard_file: str | None = None,
        overwrite: bool = False,
        checksum_algo: str = CHECKSUM_ALGO,
    ) -> None:
        """``overwrite``: ``path`` is an existing file (a recycled spare, ``store.SpareFiles``)
        whose pages are written over instead of truncated away; it is cut or grown to the
        planned size first, and every byte up to that size is written (header, padding and
        tensors are contiguous), so nothing of its old content remains."""
        for name, tensor in planned.items():
            if tensor.dtype not in _ST_DTYPES:
                raise ValueError(f"{name}: dtype {tensor.dtype} has no safetensors code; convert it first")
        self.path = path
        self.header, self.placed = _layout_file(planned)
        self._by_name = {p.name: p for p in self.placed}
        self._specs = {name: specs[name] for name in planned}
        self._shard_file = shard_file or path.name
        self.checksum_algo = checksum_algo
        format_digest(checksum_algo, 0)  # an unknown algorithm raises here
        self._crcs: dict[str, str] = {}
        flags = os.O_WRONLY if overwrite else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        self._fd: int | None = os.open(path, flags, 0o644)
        if overwrite:
            last = self.placed[-1] if self.placed else None
            os.ftruncate(self._fd, len(self.header) if last is None else last.offset + last.nbytes)
        _pwrite_all(self._fd, memoryview(self.header), 0)

    def write(self, name: str, tensor: torch.Tensor, *, checksum: str | None = None) -> None:
        """Write ``tensor`` (CPU) as ``name``: its shape and dtype must be the planned ones.
        ``checksum``: its checksum of this shard's ``checksum_algo`` (manifest spelling), already
        checked by the caller against these very bytes (a delta's applied copy): recorded
        without a second pass over them."""
        planned = self._by_name.get(name)
        if planned is None:
            raise ValueError(f"{self.path}: {name} is not planned in this shard; plan it with the others")
        _check_writable(name, tensor)
        if tuple(tensor.shape) != tuple(planned.tensor.shape) or tensor.dtype != planned.tensor.dtype:
            raise ValueError(
                f"{self.path}: {name} is {dtype_name(tensor.dtype)}{list(tensor.shape)}, planned as "
                f"{dtype_name(planned.tensor.dtype)}{list(planned.tensor.shape)}"
            )
        if name in self._crcs:
            raise ValueError(f"{self.path}: {name} is written twice; write each planned tensor once")
        assert self._fd is not None, "write after close"
        self._crcs[name] = _write_tensor(
            self._fd, _Placed(name, tensor, planned.offset, planned.nbytes), checksum, self.checksum_algo
        )

    def finish(self, *, durable: bool = True) -> tuple[int, tuple[TensorEntry, ...]]:
        """``durable=False``: no fsync (a volatile cache, ``store.mark_volatile``)."""
        missing = [p.name for p in self.placed if p.name not in self._crcs]
        if missing:
            raise ValueError(
                f"{self.path}: {len(missing)} planned tensors were never written ({missing[:3]}); "
                "write every planned tensor before finish()"
            )
        assert self._fd is not None, "finish after close"
        if durable:
            os.fsync(self._fd)
        self.close()
        entries = tuple(
            TensorEntry(
                name=p.name,
                shape=tuple(p.tensor.shape),
                dtype=dtype_name(p.tensor.dtype),
                shard_file=self._shard_file,
                nbytes=p.nbytes,
                checksum=self._crcs[p.name],
                partition=self._specs[p.name],
            )
            for p in self.placed
        )
        return len(self.header) + sum(p.nbytes for p in self.placed), entries

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _layout_file(tensors: Mapping[str, torch.Tensor]) -> tuple[bytes, list[_Placed]]:
    # Widest dtypes first: with an 8-aligned data start, every tensor is aligned to its element size.
    ordered = sorted(tensors.items(), key=lambda item: (-item[1].element_size(), item[0]))
    meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    position = 0
    sizes = []
    for name, tensor in ordered:
        nbytes = tensor.numel() * tensor.element_size()
        meta[name] = {
            "dtype": _ST_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [position, position + nbytes],
        }
        sizes.append(nbytes)
        position += nbytes
    body = json.dumps(meta, separators=(",", ":")).encode()
    body += b" " * (-(8 + len(body)) % 8)
    header = len(body).to_bytes(8, "little") + body
    placed, start = [], len(header)
    for (name, tensor), nbytes in zip(ordered, sizes, strict=True):
        placed.append(_Placed(name=name, tensor=tensor, offset=start, nbytes=nbytes))
        start += nbytes
    return header, placed


def _write_tensor(fd: int, placed: _Placed, checksum: str | None = None, algo: str = CHECKSUM_ALGO) -> str:
    raw = _raw_bytes(placed.tensor)
    if checksum is not None:
        _pwrite_all(fd, raw, placed.offset)
        return checksum
    digest = _Digest(algo)
    for start in range(0, len(raw), _CHUNK):
        chunk = raw[start : start + _CHUNK]
        digest.update(chunk)
        _pwrite_all(fd, chunk, placed.offset + start)
    return digest.hexdigest()


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def read_shard(
    snapshot_dir: Path, manifest: SnapshotManifest, shard: ShardEntry, *, num_threads: int | None = None
) -> dict[str, torch.Tensor]:
    """Load every tensor of ``shard`` and check it against the manifest; raise SnapshotError on any mismatch."""
    return read_shards(snapshot_dir, manifest, [shard], num_threads=num_threads)[shard.file]


def read_shards(
    snapshot_dir: Path,
    manifest: SnapshotManifest,
    shards: Sequence[ShardEntry],
    *,
    num_threads: int | None = None,
) -> dict[str, dict[str, torch.Tensor]]:
    """Several shards of one snapshot read by one thread pool (files overlap, not only tensors)."""
    with open_shards(snapshot_dir, manifest, shards) as jobs:
        loaded = run_in_bins(jobs, lambda job: job.entry.nbytes, read_tensor, num_threads)
    out: dict[str, dict[str, torch.Tensor]] = {s.file: {} for s in shards}
    for job, tensor in zip(jobs, loaded, strict=True):
        out[job.entry.shard_file][job.entry.name] = tensor
    return out


def verify_shard(
    snapshot_dir: Path, manifest: SnapshotManifest, shard: ShardEntry, *, num_threads: int | None = None
) -> int:
    """Every check `read_shard` makes (size, header, each tensor's CRC-32), keeping no tensor.

    Reads in 8 MiB chunks into one buffer per thread; returns the tensor bytes verified.
    Raises SnapshotError on any mismatch, a truncated or corrupted file included.
    """
    with open_shards(snapshot_dir, manifest, [shard]) as jobs:
        run_in_bins(jobs, lambda job: job.entry.nbytes, _verify_tensor, num_threads)
    return sum(job.entry.nbytes for job in jobs)


@contextlib.contextmanager
def open_shards(
    snapshot_dir: Path, manifest: SnapshotManifest, shards: Sequence[ShardEntry]
) -> Iterator[list[ReadJob]]:
    """One read job per tensor of ``shards``, files checked (size, header) and open while inside.

    An OSError inside (opening, reading) comes out as a SnapshotError: the snapshot is unreadable.
    """
    jobs: list[ReadJob] = []
    fds: list[int] = []
    try:
        for shard in shards:
            path = Path(snapshot_dir) / shard.file
            offsets = check_shard_file(path, manifest, shard)
            fds.append(fd := os.open(path, os.O_RDONLY))
            jobs.extend(
                ReadJob(path=path, fd=fd, offset=offsets[e.name], entry=e, algo=manifest.checksum_algo)
                for e in manifest.tensors_in(shard.file)
            )
        yield jobs
    except OSError as err:
        raise SnapshotError(f"snapshot v{manifest.version}: cannot read {snapshot_dir}: {err}") from err
    finally:
        for fd in fds:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class ReadJob:
    """One tensor of an open shard file: where its bytes are and what the manifest says they are."""

    path: Path
    fd: int
    offset: int  # absolute position of the tensor's bytes in the file
    entry: TensorEntry
    algo: str = CHECKSUM_ALGO
    """The manifest's ``checksum_algo``: what ``entry.checksum`` is."""


def check_shard_file(path: Path, manifest: SnapshotManifest, shard: ShardEntry) -> dict[str, int]:
    """Size and header against the manifest (no tensor bytes read); returns each tensor's file offset.

    This is the whole check of a hop that does not read the bytes (identity conversion).
    """
    if not path.is_file():
        raise SnapshotError(f"snapshot v{manifest.version}: shard file {path} is missing")
    size = path.stat().st_size
    if size != shard.nbytes:
        raise SnapshotError(
            f"snapshot v{manifest.version}: {path} has {size} bytes, manifest says {shard.nbytes} "
            "(truncated or rewritten)"
        )
    header, data_start = read_header(path, size)
    entries = manifest.tensors_in(shard.file)
    present = set(header) - {"__metadata__"}
    expected = {e.name for e in entries}
    if present != expected:
        missing = sorted(expected - present)[:5]
        extra = sorted(present - expected)[:5]
        raise SnapshotError(
            f"{path}: tensors differ from the manifest (missing {missing}, unexpected {extra})"
        )
    return {e.name: data_start + _check_entry(path, e, header[e.name], data_start, size) for e in entries}


def read_header(path: Path, size: int) -> tuple[dict[str, Any], int]:
    """A safetensors file's JSON header and the offset its data starts at; SnapshotError if malformed."""
    with path.open("rb") as handle:
        prefix = handle.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < length <= min(_MAX_HEADER, size - 8):
            raise SnapshotError(f"{path}: not a safetensors file (header length {length})")
        try:
            header = json.loads(handle.read(length))
        except ValueError as err:
            raise SnapshotError(f"{path}: malformed safetensors header ({err})") from err
    if not isinstance(header, dict):
        raise SnapshotError(f"{path}: malformed safetensors header (not an object)")
    return header, 8 + length


def _check_entry(path: Path, entry: TensorEntry, info: Any, data_start: int, size: int) -> int:
    """Header entry against the manifest entry; returns its start within the data section."""
    try:
        dtype = _TORCH_DTYPES[info["dtype"]]
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(x) for x in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as err:
        raise SnapshotError(f"{path}: header entry of {entry.name} is malformed ({err})") from err
    if shape != entry.shape or dtype_name(dtype) != entry.dtype:
        raise SnapshotError(
            f"{path}: {entry.name} is {dtype_name(dtype)}{list(shape)}, "
            f"manifest says {entry.dtype}{list(entry.shape)}"
        )
    if end - begin != entry.nbytes or begin < 0 or data_start + end > size:
        raise SnapshotError(
            f"{path}: {entry.name} spans bytes [{begin}, {end}) of the data, manifest says {entry.nbytes} bytes"
        )
    return begin


def read_tensor(job: ReadJob) -> torch.Tensor:
    """``job``'s tensor in fresh memory, CRC-checked."""
    tensor = torch.empty(job.entry.shape, dtype=_BY_NAME[job.entry.dtype])
    read_into(job, tensor)
    return tensor


def read_into(job: ReadJob, tensor: torch.Tensor) -> None:
    """Read ``job``'s tensor into ``tensor`` (contiguous CPU memory of its size), CRC-checked."""
    nbytes = tensor.numel() * tensor.element_size()
    if not tensor.is_contiguous() or tensor.device.type != "cpu" or nbytes != job.entry.nbytes:
        raise ValueError(
            f"{job.entry.name}: cannot read {job.entry.nbytes} bytes into a {nbytes}-byte "
            f"{'' if tensor.is_contiguous() else 'strided '}{tensor.device} tensor; pass contiguous CPU memory"
        )
    raw = _raw_bytes(tensor) if nbytes else memoryview(b"")
    digest = _Digest(job.algo)
    for start in range(0, len(raw), _CHUNK):
        chunk = raw[start : start + _CHUNK]
        _pread_exact(job, chunk, start)
        digest.update(chunk)
    _check_digest(job, digest)


def _verify_tensor(job: ReadJob) -> None:
    buffer = _chunk_buffer()
    digest = _Digest(job.algo)
    for start in range(0, job.entry.nbytes, _CHUNK):
        chunk = buffer[: min(_CHUNK, job.entry.nbytes - start)]
        _pread_exact(job, chunk, start)
        digest.update(chunk)
    _check_digest(job, digest)


_local = threading.local()


def _chunk_buffer() -> memoryview:
    """This thread's reused read buffer: what bounds a verification's memory."""
    buffer = getattr(_local, "buffer", None)
    if buffer is None:
        buffer = _local.buffer = memoryview(bytearray(_CHUNK))
    return buffer


def _pread_exact(job: ReadJob, chunk: memoryview, start: int) -> None:
    """Fill ``chunk`` from the tensor's byte ``start`` on; a short file is a SnapshotError."""
    got = 0
    while got < len(chunk):
        n = os.preadv(job.fd, [chunk[got:]], job.offset + start + got)
        if n == 0:
            raise SnapshotError(f"{job.path}: {job.entry.name} ends early (file truncated while reading)")
        got += n


def _check_digest(job: ReadJob, digest: _Digest) -> None:
    actual = digest.hexdigest()
    if actual != job.entry.checksum:
        raise SnapshotError(
            f"{job.path}: {job.entry.name} checksum {actual} != manifest {job.entry.checksum} (corrupted)"
        )


def run_in_bins(
    items: Sequence[_T], weight: Callable[[_T], int], work: Callable[[_T], _R], num_threads: int | None
) -> list[_R]:
    """``work(item)`` for every item, in item order; items binned by weight over up to ``num_threads`` threads."""
    indexed = list(enumerate(items))
    bins = _bin_by_size(indexed, lambda pair: weight(pair[1]), num_threads or default_io_threads())
    results: list[Any] = [None] * len(items)

    def run(group: list[tuple[int, _T]]) -> None:
        for index, item in group:
            results[index] = work(item)

    if len(bins) <= 1:
        for group in bins:
            run(group)
    else:
        with ThreadPoolExecutor(max_workers=len(bins), thread_name_prefix="snapshot-io") as pool:
            list(pool.map(run, bins))  # consumed so a worker's exception is raised here
    return results


def _bin_by_size(items: Sequence[_T], weight: Callable[[_T], int], num_bins: int) -> list[list[_T]]:
    """Greedy largest-first into the lightest bin: big tensors spread out, small ones share a bin."""
    bins: list[list[_T]] = [[] for _ in range(min(max(1, num_bins), len(items)))]
    loads = [0] * len(bins)
    for item in sorted(items, key=weight, reverse=True):
        lightest = loads.index(min(loads))
        bins[lightest].append(item)
        loads[lightest] += weight(item)
    return bins
