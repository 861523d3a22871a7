"""Snapshot directory store: atomic publish, discovery, leases and retention.

Layout of a snapshot root (the TU export root, or a GU's converted cache)::

    <root>/v<N>/                     published: manifest.json + shard files, complete by construction
    <root>/.staging-v<N>/            per-rank shards of an export still being written
    <root>/.tmp-v<N>-<uuid>/         being assembled; renamed to v<N> in one step
    <root>/.trash-v<N>-<uuid>/       unpublished by retention, being deleted
    <root>/.leases/v<N>.<uuid>       a reader holds v<N>; retention will not delete it

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
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from mindspeed_rl.workers.resharding.manifest import MANIFEST_NAME, SnapshotInfo

_PUBLISHED = re.compile(r"^v(\d+)$")
_SCRATCH = re.compile(r"^\.(staging|tmp|trash)-v(\d+)")
LEASE_DIR = ".leases"
DEFAULT_LEASE_TTL_S = 1800.0


def snapshot_dirname(version: int) -> str:
    return f"v{version}"


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


def publish_dir(temp_dir: Path, root: Path, version: int) -> SnapshotInfo:
    """Rename a fully written temp dir (manifest last, files fsynced) to ``<root>/v<version>``."""
    target = Path(root) / snapshot_dirname(version)
    if not (temp_dir / MANIFEST_NAME).is_file():
        raise AssertionError(f"publish_dir called on {temp_dir} before its manifest was written")
    fsync_path(temp_dir)
    if target.exists():
        raise ValueError(
            f"snapshot {target} is already published; policy versions must increase, export version "
            f"{version + 1} or later"
        )
    os.rename(temp_dir, target)
    fsync_path(Path(root))
    return SnapshotInfo(version=version, path=target)


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


def prune(root: Path, keep_last: int, lease_ttl_s: float = DEFAULT_LEASE_TTL_S) -> tuple[int, ...]:
    """Delete published snapshots older than the newest ``keep_last``, sparing leased ones.

    Also removes scratch dirs (staging/tmp/trash) of versions below the newest
    published one: exports publish in version order, so nobody writes them anymore.
    Returns the deleted versions.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last={keep_last} would delete the snapshot actors need; use keep_last >= 1")
    root = Path(root)
    published = list_published(root)
    held = leased_versions(root, lease_ttl_s)
    victims = [info for info in published[:-keep_last] if info.version not in held]
    for info in victims:
        trash = root / f".trash-v{info.version}-{uuid.uuid4().hex[:12]}"
        os.rename(info.path, trash)
        shutil.rmtree(trash)
    if published:
        _remove_scratch_below(root, published[-1].version)
    return tuple(info.version for info in victims)


def _remove_scratch_below(root: Path, newest: int) -> None:
    for child in root.iterdir():
        match = _SCRATCH.match(child.name)
        if match and int(match.group(2)) < newest:
            shutil.rmtree(child)
