"""Delta weight sync: a refresh carries, per tensor, only the elements that changed since the
version the receiver holds, and every applied version is checked bit for bit.

::

    TU rank r (DeltaEncoder, one per rank)          GU (DeltaReceiver, one per sending rank)
    ──────────────────────────────────────          ────────────────────────────────────────
    base = receiver.base_version  ◄──── asks ────── base_version: None = unknown / reset
    encode(v, tensors, base)
      full   if mode off, base unknown / not ours,
             every full_interval versions, or (auto)
             the delta is not small enough
      sparse per tensor otherwise: (indices, new
             values) of the elements whose bits
             changed; xxh3_64 of the full result    apply(refresh): full → replace; sparse →
      ──── DeltaRefresh (typed record) ──────────►    scatter into the host copy, then the
                                                     checksum the refresh names (xxh3_64) of
                                                     each tensor; a mismatch → DeltaMismatch
                                                     naming tensor + version, base reset
                                                     (the next ask is "unknown": a full resend)

Elements are compared and carried as their raw bits (bf16 as 16-bit words), so nothing is
rounded and a NaN payload or -0.0 survives: exact by construction, and the checksum proves it.
Why sparse (indices + values) and not xor + a compressor: measured in ``benchmarks/
snapshot_io.py --delta`` (docs/guides/weight-delta.md): at lr 1e-6 both carry about 4 % of the
bytes, but xor + zlib (this environment installs no zstd / lz4) spends 2-4x the sparse encode's
CPU, and sparse needs no dependency.

Checksum: xxh3_64 (``xxhash``), named in each refresh (``DeltaRefresh.checksum_algo``, carried in
the wire form; a refresh packed before the field existed reads as crc32). Both sides pass over
every word of every refresh with it, so its speed is a term of every refresh: measured on this
host, xxh3_64 26-31 GB/s against zlib.crc32's 3.2-3.6 GB/s. Like the manifest's CRC-32 it guards
against corruption and bugs (a wrong scatter, a lost part), not an adversary: a 64-bit hash is
at least as strong for that.

One model copy of host memory on each side: the encoder keeps the last version it sent (its
base for the next delta), the receiver its applied copy. No torch needed here but for the
tensors' bit views; no Ray.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import numpy as np
import torch
import xxhash

from mindspeed_rl.weights.delta_kernels import scatter_words, sparse_misfit, sparse_words
from mindspeed_rl.weights.manifest import SnapshotError

logger = logging.getLogger(__name__)

DeltaMode = Literal["off", "auto", "on"]
AUTO_MAX_FRACTION = 0.5
"""``weight_delta: auto`` sends a delta only when its bytes are below this fraction of the full
refresh's (above it, the scatter on the receiver costs more than the bytes it saves)."""

Encoding = Literal["full", "sparse"]
ChecksumAlgo = Literal["xxh3_64", "crc32"]
CHECKSUM_ALGO: ChecksumAlgo = "xxh3_64"
"""What an encoder checksums each tensor with (the module docstring says why)."""

_T = TypeVar("_T")
_R = TypeVar("_R")


def _threads() -> int:
    # As shardio.default_io_threads: numpy's compares / gathers / scatters and zlib's crc32 of a
    # large buffer release the GIL, so the per-tensor passes of encode and apply run on this many
    # threads (measured on the 2-core host: the passes over the full words dominate a refresh).
    import os

    return min(8, max(2, os.cpu_count() or 1))


def _map(fn: Callable[[_T], _R], items: Sequence[_T], threads: int | None = None) -> list[_R]:
    """``[fn(x) for x in items]`` in order, on ``threads`` threads (the largest tensors first)."""
    n = _threads() if threads is None else threads
    if n <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="delta") as pool:
        return list(pool.map(fn, items))


class DeltaMismatch(SnapshotError):
    """An applied tensor's checksum differs from the sender's: the receiver's copy is not the
    trainer's. The receiver has dropped its base; the next refresh must be full."""


class BaseMismatch(SnapshotError):
    """A delta was built on a base the receiver does not hold (it asks for a full one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorDelta:
    name: str
    dtype: str
    """torch dtype name (``bfloat16``)."""
    shape: tuple[int, ...]
    encoding: Encoding
    checksum: int
    """The checksum (the refresh's ``checksum_algo``) of the full tensor's bytes after applying
    (what the receiver must hold)."""
    data: np.ndarray
    """full: the tensor's raw words; sparse: the changed elements' new raw words."""
    indices: np.ndarray | None = None
    """sparse: the low 16 bits of each changed element's flat index, ascending (uint16)."""
    blocks: np.ndarray | None = None
    """sparse: changed elements per block of 65536 (uint32): the indices' high bits, as counts.
    2 bytes per changed element instead of 4 or 8, plus 4 bytes per 65536 elements."""

    @property
    def nbytes(self) -> int:
        extra = sum(int(a.nbytes) for a in (self.indices, self.blocks) if a is not None)
        return int(self.data.nbytes) + extra


@dataclass(frozen=True, slots=True, kw_only=True)
class DeltaRefresh:
    """One rank's refresh to one receiver: ``base_version`` None = a full snapshot."""

    version: int
    base_version: int | None
    tensors: tuple[TensorDelta, ...]
    full_nbytes: int
    """What a full refresh of the same tensors would carry (for the changed fraction)."""
    changed_elements: int
    total_elements: int
    encode_seconds: float
    checksum_algo: ChecksumAlgo = CHECKSUM_ALGO
    """What every part's ``checksum`` is (self-describing: a receiver checks with this one)."""

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def is_full(self) -> bool:
        return self.base_version is None


@dataclass(slots=True)
class DeltaStats:
    """Per-refresh figures and their totals (``summary.json``: ``as_summary``)."""

    refreshes: int = 0
    full_refreshes: int = 0
    resends: int = 0
    bytes_sent: int = 0
    full_bytes: int = 0
    changed_elements: int = 0
    total_elements: int = 0
    encode_seconds: float = 0.0
    apply_seconds: float = 0.0
    last: dict[str, float] = field(default_factory=dict)

    def record(
        self, refresh: DeltaRefresh, apply_seconds: float, *, resend: bool = False
    ) -> dict[str, float]:
        self.refreshes += 1
        self.full_refreshes += int(refresh.is_full)
        self.resends += int(resend)
        self.bytes_sent += refresh.nbytes
        self.full_bytes += refresh.full_nbytes
        self.changed_elements += refresh.changed_elements
        self.total_elements += refresh.total_elements
        self.encode_seconds += refresh.encode_seconds
        self.apply_seconds += apply_seconds
        self.last = {
            "delta_bytes_sent": float(refresh.nbytes),
            "delta_changed_fraction": refresh.changed_elements / max(refresh.total_elements, 1),
            "delta_encode_seconds": refresh.encode_seconds,
            "delta_apply_seconds": apply_seconds,
            "delta_full": float(refresh.is_full),
        }
        return self.last

    def as_summary(self) -> dict[str, float]:
        return {
            "delta_refreshes": float(self.refreshes),
            "delta_full_refreshes": float(self.full_refreshes),
            "delta_resends": float(self.resends),
            "delta_bytes_sent": float(self.bytes_sent),
            "delta_full_bytes": float(self.full_bytes),
            "delta_bytes_fraction": self.bytes_sent / max(self.full_bytes, 1),
            "delta_changed_fraction": self.changed_elements / max(self.total_elements, 1),
            "delta_encode_seconds": self.encode_seconds,
            "delta_apply_seconds": self.apply_seconds,
        }


def words(tensor: torch.Tensor, *, copy: bool = True) -> np.ndarray:
    """The tensor's elements as unsigned words of its element size (its bits, not its values),
    flat, on the host: a copy the caller owns (``copy=False``: a view, for a host tensor nobody
    changes any more, such as the exporter's own copy)."""
    t = tensor.detach().to("cpu").contiguous().reshape(-1)
    size = t.element_size()
    if size not in (1, 2, 4, 8):
        raise ValueError(f"delta sync carries 1/2/4/8-byte elements; {t.dtype} has {size}")
    flat = t.view(torch.uint8).numpy().view(np.dtype(f"u{size}"))
    return flat.copy() if copy else flat


def from_words(flat: np.ndarray, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor whose bits are ``flat`` (shares its memory)."""
    return torch.from_numpy(flat.view(np.uint8)).view(getattr(torch, dtype)).reshape(shape)


def checksum(flat: np.ndarray, algo: ChecksumAlgo = CHECKSUM_ALGO) -> int:
    """``algo`` of the words' bytes (a flat, contiguous array)."""
    data = flat.view(np.uint8).data
    if algo == "xxh3_64":
        return xxhash.xxh3_64_intdigest(data)
    if algo == "crc32":
        return zlib.crc32(data)
    raise ValueError(f"unknown delta checksum {algo!r}; this receiver knows xxh3_64 and crc32")


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


class DeltaEncoder:
    """A TU rank's side: encode each version against the base the receiver says it holds."""

    def __init__(
        self,
        mode: DeltaMode = "on",
        *,
        full_interval: int = 10,
        threads: int | None = None,
        checksum_algo: ChecksumAlgo = CHECKSUM_ALGO,
    ) -> None:
        if mode not in ("off", "auto", "on"):
            raise ValueError(f"async_config.weight_delta={mode!r}; use off, auto or on")
        if full_interval < 1:
            raise ValueError(
                f"async_config.delta_full_interval={full_interval}: a full snapshot every N >= 1 versions"
            )
        checksum(np.zeros(1, np.uint8), checksum_algo)  # an unknown algorithm raises here
        self.mode: DeltaMode = mode
        self.full_interval = full_interval
        self.checksum_algo: ChecksumAlgo = checksum_algo
        self._base_version: int | None = None
        self._base: dict[str, np.ndarray] = {}
        self._last_full: int | None = None
        self._spare: dict[str, np.ndarray] | None = None
        self._spare_lock = threading.Lock()
        self.threads = threads
        """Threads for the per-tensor passes (None: one per core, 2..8)."""

    @property
    def base_version(self) -> int | None:
        """The version this encoder's next delta is built on (the last one it encoded)."""
        return self._base_version

    def encode(
        self,
        version: int,
        tensors: Iterable[tuple[str, torch.Tensor]],
        receiver_base: int | None,
        *,
        owned: bool = False,
    ) -> DeltaRefresh:
        """``owned``: the tensors are host copies that no one changes any more (the exporter's);
        the encoder keeps views of them as its next base instead of copying them. Not owned: a
        full refresh copies them; a delta compares them with the base where they are and
        writes only the changed words into the base (no copy of the whole model). A full
        refresh's parts view the encoder's base, as ``full_of_base``'s do: valid until the next
        ``encode`` (every medium packs or copies a refresh before that; receivers copy a full
        part and scatter a sparse one, never keep its arrays)."""
        started = time.perf_counter()
        current = {name: (t, words(t, copy=False)) for name, t in tensors}
        full_nbytes = sum(int(w.nbytes) for _, w in current.values())
        total = sum(int(w.size) for _, w in current.values())
        delta_ok = (
            self.mode != "off"
            and receiver_base is not None
            and receiver_base == self._base_version
            and self._last_full is not None
            and version - self._last_full < self.full_interval
            and set(current) == set(self._base)
        )
        parts: list[TensorDelta] | None = None
        changed = total
        if delta_ok:
            parts, changed = self._sparse(current, in_place=not owned)
            nbytes = sum(p.nbytes for p in parts)
            if self.mode == "auto" and nbytes >= AUTO_MAX_FRACTION * full_nbytes:
                parts = None
        base = receiver_base if parts is not None else None
        if parts is None:
            changed = total
            if not owned:  # the caller's tensors may change after this call: keep copies
                current = {name: (t, w.copy()) for name, (t, w) in current.items()}
            parts = _full_parts(current, self.threads, self.checksum_algo)
            self._last_full = version
        if owned or base is None:
            old_base, self._base = self._base, {name: w for name, (_, w) in current.items()}
            if owned and old_base:
                with self._spare_lock:  # the exporter copies the next version into it
                    self._spare = old_base
        # else: _sparse advanced the base in place to this version's words
        self._base_version = version
        return DeltaRefresh(
            version=version,
            base_version=base,
            tensors=tuple(parts),
            full_nbytes=full_nbytes,
            changed_elements=changed,
            total_elements=total,
            encode_seconds=time.perf_counter() - started,
            checksum_algo=self.checksum_algo,
        )

    def take_spare(self, like: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The base this encoder let go at its last ``owned`` encode, as tensors shaped like
        ``like`` where the bytes fit: the exporter copies the next version into them
        (``export._prepare``) instead of fresh memory, whose pages fault on first touch (the
        export copy of 366 MB: 0.2-0.4 s into fresh memory, 0.03 s into these, on the 2-core
        host). Handed over once (empty until the next owned encode); nothing views it any more:
        a full refresh's parts view the base that replaced it, and a refresh is packed or
        copied before the next encode. The price: the TU rank keeps a second copy of its
        tensors between refreshes (at most as much as an export holds while encoding)."""
        with self._spare_lock:
            spare, self._spare = self._spare, None
        if not spare:
            return {}
        out: dict[str, torch.Tensor] = {}
        for name, tensor in like:
            flat = spare.get(name)
            if flat is not None and flat.nbytes == tensor.numel() * tensor.element_size():
                out[name] = from_words(flat, _dtype_name(tensor), tuple(tensor.shape))
        return out

    def full_of_base(self, like: DeltaRefresh) -> DeltaRefresh:
        """The last encoded version in full, for a receiver that does not hold ``like``'s base
        (collective: one GU asked while the others take the delta). No copy: the parts view the
        encoder's base, which nothing changes until the next ``encode``."""
        if self._base_version != like.version:
            raise ValueError(f"the encoder holds v{self._base_version}, not v{like.version}")
        started = time.perf_counter()
        meta = {part.name: (part.dtype, part.shape) for part in like.tensors}
        current = {name: (from_words(w, *meta[name]), w) for name, w in self._base.items()}
        parts = _full_parts(current, self.threads, self.checksum_algo)
        return DeltaRefresh(
            version=like.version,
            base_version=None,
            tensors=tuple(parts),
            full_nbytes=like.full_nbytes,
            changed_elements=like.total_elements,
            total_elements=like.total_elements,
            encode_seconds=time.perf_counter() - started,
            checksum_algo=self.checksum_algo,
        )

    def _sparse(
        self, current: Mapping[str, tuple[torch.Tensor, np.ndarray]], *, in_place: bool
    ) -> tuple[list[TensorDelta], int]:
        """One sparse part per tensor. ``in_place``: the words are the caller's (not ours to
        keep), so the changed ones are written into the base, which then holds this version,
        and the checksum is taken over the base (the same bits, and memory nobody else writes)."""
        for name, (_, w) in current.items():
            old = self._base[name]
            if old.shape != w.shape or old.dtype != w.dtype:
                raise ValueError(f"tensor {name} changed shape or dtype between versions; resend in full")
        algo = self.checksum_algo

        def one(item: tuple[str, tuple[torch.Tensor, np.ndarray]]) -> TensorDelta:
            name, (t, w) = item
            old = self._base[name]
            # One compiled pass: compare, collect in the wire form, and (in place) advance the base.
            low, values, blocks = sparse_words(old, w, write_back=in_place)
            return TensorDelta(
                name=name,
                dtype=_dtype_name(t),
                shape=tuple(t.shape),
                encoding="sparse",
                checksum=checksum(old if in_place else w, algo),
                data=values,
                indices=low,
                blocks=blocks,
            )

        try:
            parts = _map(one, list(current.items()), self.threads)
        except BaseException:
            if in_place:  # some bases may hold the new words already: none is trustworthy now
                self._base, self._base_version, self._last_full = {}, None, None
            raise
        return parts, sum(int(p.data.size) for p in parts)


def _full_parts(
    current: Mapping[str, tuple[torch.Tensor, np.ndarray]], threads: int | None, algo: ChecksumAlgo
) -> list[TensorDelta]:
    return _map(
        lambda item: TensorDelta(
            name=item[0],
            dtype=_dtype_name(item[1][0]),
            shape=tuple(item[1][0].shape),
            encoding="full",
            checksum=checksum(item[1][1], algo),
            data=item[1][1],
        ),
        list(current.items()),
        threads,
    )


class DeltaReceiver:
    """A GU's copy of one sending rank's tensors, advanced by each refresh and checked."""

    def __init__(self, *, threads: int | None = None) -> None:
        self.threads = threads
        """Threads for the per-tensor scatter + checksum (None: one per core, 2..8)."""
        self.base_version: int | None = None
        """What to tell the encoder; None = unknown (a full refresh is needed)."""
        self._copy: dict[str, np.ndarray] = {}
        self._meta: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._checksums: dict[str, tuple[ChecksumAlgo, int]] = {}

    def reset(self) -> None:
        """Forget the base (after a mismatch, a restart or a resume): the next refresh is full."""
        self.base_version = None
        self._copy.clear()
        self._meta.clear()
        self._checksums.clear()

    def apply(self, refresh: DeltaRefresh) -> float:
        """Apply ``refresh`` to the copy; returns the seconds it took. Raises ``BaseMismatch``
        (delta on another base) or ``DeltaMismatch`` (a checksum differs) with the base reset."""
        started = time.perf_counter()
        if not refresh.is_full and refresh.base_version != self.base_version:
            held = self.base_version
            self.reset()
            raise BaseMismatch(
                f"v{refresh.version}: a delta on v{refresh.base_version}, but this receiver holds "
                f"{'nothing' if held is None else f'v{held}'}; a full refresh is needed"
            )
        if refresh.is_full:
            self._copy.clear()
            self._meta.clear()
            self._checksums.clear()
        for part in refresh.tensors:  # the structure first, serially: nothing changed yet on error
            if part.encoding == "full":
                continue
            base_copy = self._copy.get(part.name)
            if base_copy is None or part.indices is None or part.blocks is None:
                self.reset()
                raise BaseMismatch(f"v{refresh.version}: tensor {part.name} has no base here")
            misfit = sparse_misfit(base_copy, part.indices, part.data, part.blocks)
            if misfit is not None:
                self.reset()
                raise DeltaMismatch(
                    f"weight delta v{refresh.version}: tensor {part.name}'s sparse part is malformed "
                    f"({misfit}); a full refresh follows"
                )

        algo = refresh.checksum_algo

        def one(part: TensorDelta) -> tuple[np.ndarray, bool]:
            # Each tensor's scatter and checksum on its own thread (numpy's scatter releases the GIL).
            if part.encoding == "full":
                flat = np.array(part.data, copy=True)
            else:
                flat = self._copy[part.name]
                assert part.indices is not None and part.blocks is not None  # checked above
                scatter_words(flat, part.indices, part.data, part.blocks)
            return flat, checksum(flat, algo) == part.checksum

        results = _map(one, list(refresh.tensors), self.threads)
        for part, (flat, _) in zip(refresh.tensors, results, strict=True):
            self._copy[part.name] = flat
            self._meta[part.name] = (part.dtype, part.shape)
            self._checksums[part.name] = (algo, part.checksum)
        bad = [part.name for part, (_, ok) in zip(refresh.tensors, results, strict=True) if not ok]
        if bad:
            self.reset()
            raise DeltaMismatch(
                f"weight delta v{refresh.version}: tensor {bad[0]} does not match the trainer's after "
                f"applying (checksum differs{f'; {len(bad) - 1} more' if len(bad) > 1 else ''}); the copy "
                "is dropped and a full refresh follows"
            )
        self.base_version = refresh.version
        return time.perf_counter() - started

    def checksums(self) -> dict[str, tuple[ChecksumAlgo, int]]:
        """Each held tensor's checksum of its bytes, with its algorithm (the trainer's, checked
        when applied)."""
        return dict(self._checksums)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The held version's tensors (views of the copy: clone before changing them)."""
        return {name: from_words(flat, *self._meta[name]) for name, flat in self._copy.items()}


CarryFn = Callable[[DeltaRefresh], DeltaRefresh]
"""What moves a refresh from sender to receiver (a transport's medium)."""


@dataclass
class DeltaLink:
    """One sending rank → one receiver, with the protocol between them: the receiver says its
    base, the encoder encodes against it, the refresh travels through ``carry`` (the medium),
    the receiver applies it; a mismatch is logged naming tensor and version, then resent full."""

    encoder: DeltaEncoder
    receiver: DeltaReceiver
    stats: DeltaStats = field(default_factory=DeltaStats)

    def refresh(self, version: int, tensors: Mapping[str, torch.Tensor], carry: CarryFn) -> dict[str, float]:
        sent = self.encoder.encode(version, tensors.items(), self.receiver.base_version)
        try:
            seconds = self.receiver.apply(carry(sent))
        except (DeltaMismatch, BaseMismatch) as err:
            logger.error("%s; resending v%d in full", err, version)
            self.stats.record(sent, 0.0)
            full = self.encoder.encode(version, tensors.items(), None)
            return self.stats.record(full, self.receiver.apply(carry(full)), resend=True)
        return self.stats.record(sent, seconds)
