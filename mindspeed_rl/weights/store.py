"""Snapshot directory store: atomic publish, discovery, leases and retention.

Layout of a snapshot root (the TU export root, or a GU's converted cache)::

    <root>/v<N>/                     published: manifest.json + shard files, complete by construction
    <root>/.staging-v<N>/            per-rank shards of an export still being written
    <root>/.tmp-v<N>-<uuid>/         being assembled; renamed to v<N> in one step
    <root>/.trash-v<N>-<uuid>/       unpublished by retention, being deleted
    <root>/.leases/v<N>.<uuid>       a reader holds v<N>; retention will not delete it
    <root>/.spare/<uuid>.spare       a retired version's file, kept to be overwritten (``SpareFiles``)

Why readers never see a half-written snapshot: files are fsynced inside the
temp dir, the manifest is written last, then the directory is renamed to
``v<N>`` (atomic on POSIX and on NFS within one export). Retention renames a
victim away from ``v<N>`` *before* deleting it, so a ``v<N>`` directory is
always either complete or absent.

Lease guarantee (shared file systems included): a reader whose lease file is
visible to the pruning process before it lists leases is never disturbed. A
reader that takes its lease while a prune is already running may find the
directory gone or files missing; the reader then fails its validation, keeps
its current weights and retries on the next minibatch. Leases older than
``lease_ttl_s`` are treated as left by a crashed process and ignored.

Runs never touch each other's snapshots. Two layers, because one folder name
(``snapshot_dir: ./snapshots`` in both cluster YAMLs) is reused run after run:

- each run writes under its own folder, ``run_root(snapshot_dir, run_id)`` =
  ``<snapshot_dir>/<run id>/``; chosen over refusing a used folder because a
  refusal turns a leftover folder into a failed launch on an idle cluster,
  while per-run folders make reuse safe and leave old runs visible by name;
- every manifest records the ``run_id`` that produced it and retention counts
  and deletes only snapshots of its own run. Without this, a root holding an
  earlier run's v197-v199 made retention delete a new run's v1 in the same
  call that published it, and the run waited forever.

Hard links: a GU's converted cache may hold hard links to the export's shard
files (identity conversion). That is safe because published files are never
written again, and deleting one directory only drops its link: the other
directory keeps the bytes. Symlinks would not be: the export's retention
would leave the cache pointing at nothing.

Recycled files (``SpareFiles``, a GU's cache only): a retired version's shard file whose only
name was in that version (``st_nlink == 1``: never a link shared with an export) is moved to
``.spare/`` instead of deleted, and the next conversion writes its file over it. Why: on the
2-core host, writing a new 366 MB file took 0.08-0.9 s (block allocation, dirty-page
throttling; it varied run to run), overwriting the pages of one still in the page cache
0.04 s every time (``benchmarks/snapshot_io.py --delta``, docs/benchmarks/weight-transports.md).
A retired version is one retention chose: no reader holds a lease on it. A reader whose lease
expired, or that races the prune, may read bytes being overwritten; it fails the checksum
check while reading and keeps its weights, as it does when it finds the files deleted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from mindspeed_rl.weights.manifest import MANIFEST_NAME, SnapshotInfo

_PUBLISHED = re.compile(r"^v(\d+)$")
_SCRATCH = re.compile(r"^\.(staging|tmp|trash)-v(\d+)")
# One path component that is not hidden (scratch and lease names start with '.').
_RUN_ID = re.compile(r"^[^./\\\x00][^/\\\x00]{0,254}$")
LEASE_DIR = ".leases"
SPARE_DIR = ".spare"
DEFAULT_LEASE_TTL_S = 1800.0
# Errors of os.link that mean "this file system cannot link here", not "something is wrong".
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}

logger = logging.getLogger(__name__)


def snapshot_dirname(version: int) -> str:
    return f"v{version}"


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise ValueError(
            f"run id {run_id!r} cannot name a folder: use one path component (no '/'), "
            "not starting with '.', at most 255 characters"
        )
    return run_id


def run_root(snapshot_dir: Path, run_id: str) -> Path:
    """``<snapshot_dir>/<run_id>``: the folder one run exports to and keeps its GU caches in."""
    return Path(snapshot_dir) / check_run_id(run_id)


def snapshot_run_id(snapshot_dir: Path) -> str | None:
    """The run that produced a published snapshot (from its manifest); None if unknown or unreadable.

    Unreadable counts as "not mine": retention then leaves it alone, never the other way round.
    """
    try:
        data = json.loads((Path(snapshot_dir) / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    run_id = data.get("run_id") if isinstance(data, dict) else None
    return run_id if isinstance(run_id, str) else None


def list_run_published(root: Path, run_id: str | None) -> list[SnapshotInfo]:
    """Published snapshots under ``root`` produced by run ``run_id``, oldest first."""
    return [info for info in list_published(root) if snapshot_run_id(info.path) == run_id]


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (directory fsync makes a rename durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_published(root: Path) -> list[SnapshotInfo]:
    """Published snapshots under ``root``, oldest first. A missing root has none."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _PUBLISHED.match(child.name)
        if match and (child / MANIFEST_NAME).is_file():
            found.append(SnapshotInfo(version=int(match.group(1)), path=child))
    return sorted(found, key=lambda info: info.version)


def latest_published(root: Path) -> SnapshotInfo | None:
    """The newest complete snapshot under ``root``, or None when there is none yet."""
    published = list_published(root)
    return published[-1] if published else None


def new_temp_dir(root: Path, version: int) -> Path:
    path = Path(root) / f".tmp-v{version}-{uuid.uuid4().hex[:12]}"
    path.mkdir(parents=True)
    return path


def publish_dir(temp_dir: Path, root: Path, version: int, *, durable: bool = True) -> SnapshotInfo:
    """Rename a fully written temp dir (manifest last, files fsynced) to ``<root>/v<version>``.
    ``durable=False``: no fsync of the folders either (a volatile cache, ``mark_volatile``)."""
    target = Path(root) / snapshot_dirname(version)
    if not (temp_dir / MANIFEST_NAME).is_file():
        raise AssertionError(f"publish_dir called on {temp_dir} before its manifest was written")
    if durable:
        fsync_path(temp_dir)
    if target.exists():
        raise ValueError(
            f"snapshot {target} is already published (by run {snapshot_run_id(target)!r}); policy "
            f"versions must increase, export version {version + 1} or later; if {root} holds an "
            "earlier run's snapshots, give this run its own folder (store.run_root)"
        )
    os.rename(temp_dir, target)
    if durable:
        fsync_path(Path(root))
    return SnapshotInfo(version=version, path=target)


VOLATILE_MARKER = ".volatile-boot"
"""In a snapshot folder written without fsync: the boot it was written in (``boot_id``)."""


def boot_id() -> str | None:
    """This boot of the kernel (Linux), or None where it cannot be read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def mark_volatile(folder: Path) -> None:
    """Record that ``folder``'s files were written without fsync, in this boot. Unsynced writes
    survive any process crash (they sit in the kernel's page cache, which every reader on the
    host shares); only a crash of the host loses them, and that is a new boot."""
    boot = boot_id()
    if boot is None:
        raise AssertionError("mark_volatile needs a boot id; write durably where there is none")
    (Path(folder) / VOLATILE_MARKER).write_text(boot)


def trusted_after_crashes(folder: Path) -> bool:
    """Whether a published folder's bytes can be trusted: written durably (no marker), or
    without fsync in this very boot (nothing was lost since)."""
    marker = Path(folder) / VOLATILE_MARKER
    if not marker.exists():
        return True
    try:
        return marker.read_text().strip() == boot_id()
    except OSError:
        return False


@contextlib.contextmanager
def lease(snapshot: SnapshotInfo) -> Iterator[Path]:
    """Hold ``snapshot`` against retention while reading it."""
    lease_dir = snapshot.path.parent / LEASE_DIR
    lease_dir.mkdir(exist_ok=True)
    path = lease_dir / f"{snapshot_dirname(snapshot.version)}.{uuid.uuid4().hex}"
    path.write_text(f"{os.getpid()}\n")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def leased_versions(root: Path, lease_ttl_s: float = DEFAULT_LEASE_TTL_S) -> set[int]:
    lease_dir = Path(root) / LEASE_DIR
    if not lease_dir.is_dir():
        return set()
    now = time.time()
    held = set()
    for entry in lease_dir.iterdir():
        version_part = entry.name.split(".", 1)[0]
        match = _PUBLISHED.match(version_part)
        if not match:
            continue
        try:
            age = now - entry.stat().st_mtime
        except FileNotFoundError:  # released between listing and stat
            continue
        if age <= lease_ttl_s:
            held.add(int(match.group(1)))
    return held


def prune(
    root: Path,
    keep_last: int,
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    *,
    run_id: str | None,
    spare: SpareFiles | None = None,
) -> tuple[int, ...]:
    """Delete run ``run_id``'s published snapshots older than its newest ``keep_last``, sparing leased ones.

    Snapshots of other runs are neither counted nor deleted (see the module docstring). Also
    removes scratch dirs (staging/tmp/trash) of versions below this run's newest published one:
    exports publish in version order, so nobody writes them anymore. Returns the deleted versions.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last={keep_last} would delete the snapshot actors need; use keep_last >= 1")
    root = Path(root)
    own = list_run_published(root, run_id)
    held = leased_versions(root, lease_ttl_s)
    victims = [info for info in own[:-keep_last] if info.version not in held]
    for info in victims:
        retire(info, spare)
    if own:
        _remove_scratch_below(root, own[-1].version)
    return tuple(info.version for info in victims)


def retire(info: SnapshotInfo, spare: SpareFiles | None = None) -> None:
    """Unpublish then delete: renamed away first, so ``v<N>`` is never seen half-deleted.
    ``spare``: its shard files are offered to it first (kept to be overwritten)."""
    trash = info.path.parent / f".trash-v{info.version}-{uuid.uuid4().hex[:12]}"
    os.rename(info.path, trash)
    if spare is not None:
        for child in sorted(trash.glob("*.safetensors")):
            spare.keep(child)
    shutil.rmtree(trash)


class SpareFiles:
    """Shard files of retired versions, kept under ``<root>/.spare`` for the next write to
    overwrite (the module docstring says why). At most ``max_files`` are kept; ``take`` hands
    one over by renaming it to where the writer will write, so two writers never share one."""

    def __init__(self, root: Path, max_files: int) -> None:
        self.folder = Path(root) / SPARE_DIR
        self.max_files = max_files

    def files(self) -> list[Path]:
        return sorted(self.folder.glob("*.spare")) if self.folder.is_dir() else []

    def keep(self, path: Path) -> bool:
        """Move ``path`` into the pool when it is a regular file no other name refers to and
        the pool has room; False: the caller deletes it."""
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or len(self.files()) >= self.max_files:
            return False
        self.folder.mkdir(exist_ok=True)
        os.rename(path, self.folder / f"{uuid.uuid4().hex}.spare")
        return True

    def take(self, target: Path, nbytes: int) -> bool:
        """Rename a spare file to ``target`` (the one whose size is closest to ``nbytes``);
        False when the pool is empty (the writer creates a new file)."""
        candidates = self.files()
        sizes = {}
        for path in candidates:
            with contextlib.suppress(FileNotFoundError):
                sizes[path] = path.stat().st_size
        for path in sorted(sizes, key=lambda p: abs(sizes[p] - nbytes)):
            try:
                os.rename(path, target)
            except FileNotFoundError:  # taken by another writer just now
                continue
            return True
        return False


def link_or_copy(source: Path, target: Path) -> bool:
    """Hard-link ``source`` as ``target``; copy (fsynced) only where the file system cannot link.

    Returns True when linked. Why not a symlink or a rename: see the module docstring.
    """
    try:
        os.link(source, target)
        return True
    except OSError as err:
        if err.errno not in _NO_LINK:
            raise
        logger.info("cannot hard-link %s to %s (%s); copying it", source, target, err.strerror)
    shutil.copyfile(source, target)
    fsync_path(target)
    return False


def _remove_scratch_below(root: Path, newest: int) -> None:
    for child in root.iterdir():
        match = _SCRATCH.match(child.name)
        if match and int(match.group(2)) < newest:
            # Publishers of consecutive versions (other rank processes) may clean up at once.
            shutil.rmtree(child, ignore_errors=True)
