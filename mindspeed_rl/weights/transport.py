"""The snapshot paths every transport shares (a memory path names an in-memory version) and the
start-up check that the run's transport can actually reach every GU (``weights/transports/``
holds the transports themselves).

::

    shared_fs     TU ── safetensors files in snapshot_dir ──► GU converts into its cache ──► actors read files
    object_store  TU ── ray.put of host numpy buffers ──────► GU plans the conversion ────► actors get an iterator
    collective    TU ── bucketed sends on one gloo group per GU ─► GU converts per bucket ─► actors get an iterator

Whatever the medium, the contract of the snapshot path is the same: increasing versions, the
integrity checks of each hop, at most one export in flight per TU rank (a newer one supersedes the
queued one), a snapshot announced to the Control Unit only once complete, and actors that reload
only between minibatches. Only ``shared_fs`` needs a folder every node sees; ``check_probe`` finds
out at start, before any model is loaded, whether that holds.

No torch and no Ray here: the plan and the Control Unit import it.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

MEMORY_SCHEME = "memory://"
"""Prefix of the ``path`` of a snapshot that lives in memory (object_store, collective): it names
the version only; the weights travel in ``SnapshotInfo.handle``."""
PROBE_PREFIX = ".probe-"


class SharedPathError(RuntimeError):
    """``weight_transport: shared_fs`` on a node that does not see the TU's snapshot folder."""


def memory_path(version: int) -> str:
    return f"{MEMORY_SCHEME}v{version}"


def is_memory_path(path: str) -> bool:
    return path.startswith(MEMORY_SCHEME)


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """What the TU wrote into the snapshot folder at start; each GU reads it back."""

    folder: str
    file: str
    token: str
    node: str
    """The host name of the TU that wrote it (named in the error)."""


def write_probe(folder: Path) -> Probe:
    """Write a file with a fresh token into ``folder`` (created if missing)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    file = f"{PROBE_PREFIX}{token[:12]}"
    path = folder / file
    path.write_text(token + "\n")
    return Probe(folder=str(folder), file=file, token=token, node=socket.gethostname())


def probe_visible(probe: Probe, folder: Path) -> bool:
    """Whether this process sees the probe's file, with its token, in ``folder`` (its own path
    to the snapshot root: the same string as the TU's wherever the folder is really shared)."""
    try:
        return (Path(folder) / probe.file).read_text().strip() == probe.token
    except OSError:
        return False


def check_probe(probe: Probe, *, shared_folder: bool, folder: Path, where: str) -> bool:
    """Raise ``SharedPathError`` when the transport needs a shared folder (``Transport.
    needs_shared_folder``) and this node does not see the probe; other transports need none.
    Returns whether the probe was seen."""
    seen = probe_visible(probe, folder)
    if seen or not shared_folder:
        return seen
    raise SharedPathError(
        f"async_config.weight_transport=shared_fs, but {where} on node {socket.gethostname()!r} "
        f"(pid {os.getpid()}) does not see {folder}/{probe.file}, written by the Training Unit on "
        f"node {probe.node!r}: the snapshot folder is not shared between these nodes. Point "
        "async_config.snapshot_dir at a folder every node mounts, or set "
        "async_config.weight_transport to object_store or collective (no shared folder needed)"
    )


def remove_probe(probe: Probe) -> None:
    (Path(probe.folder) / probe.file).unlink(missing_ok=True)
