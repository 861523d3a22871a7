"""``snapshot_io.py --delta``'s wired cases: each transport's real exporters and GU end,
``weight_delta`` on against off, timed per version from the TU ranks' export call, every version
checked bit for bit where the actors read it. ``snapshot_io_delta`` steps the model and calls them.

- ``wired_case``: ``shared_fs`` (files in a snapshot root on this host's disk);
- ``object_store_case``: a local Ray instance;
- ``object_store_two_node_case``: the GU and a reader on a second node of a Ray test cluster;
- ``collective_case``: a gloo group, the TU ranks and the GU's receiver on threads of this process.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mindspeed_rl.weights.delta import checksum, words
from mindspeed_rl.weights.layout import TrainingLayout
from mindspeed_rl.weights.transports import DeltaSettings

KINDS: tuple[tuple[str, DeltaSettings | None], ...] = (
    ("off", None),
    ("on", DeltaSettings(mode="on", full_interval=10**6)),
)
"""Each case runs ``weight_delta`` off, then on (never a periodic full: the deltas are timed)."""


def tp_ranks(layout: TrainingLayout, full: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    out: list[dict[str, torch.Tensor]] = []
    for rank in range(layout.world_size):
        coords = layout.coords(rank)
        mine = {}
        for name, t in full.items():
            spec = layout.spec_for(name)
            if not layout.writes(spec, coords):
                continue
            if spec.tp_dim is not None:
                t = t.chunk(layout.tp_size, dim=spec.tp_dim)[coords.tp_rank]
            mine[name] = t.contiguous()
        out.append(mine)
    return out


def export_all(
    writers: Sequence[Any], layout: TrainingLayout, version: int, full: dict[str, torch.Tensor]
) -> list[Any]:
    """Every TU rank's export of ``version`` (its TP piece of ``full``), waited for: the results."""
    shards = tp_ranks(layout, full) if layout.world_size > 1 else [full]
    futures = [w.export(version, shards[r].items(), layout, r) for r, w in enumerate(writers)]
    return [f.result() for f in futures]


def assert_bits(got: Mapping[str, torch.Tensor], full: dict[str, torch.Tensor], where: Any) -> None:
    """Exact: what the actors load is the trainer's bits."""
    for name, t in full.items():
        assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), (where, name)


def close_all(writers: Sequence[Any]) -> None:
    for w in writers:
        w.close()  # a collective sender lets its group go: the GU's receiver then ends
        if hasattr(w, "release_all"):
            w.release_all()


def wired_case(
    layout: TrainingLayout, versions: list[dict[str, torch.Tensor]], tmp: Path, warm: int = 0
) -> dict[str, Any]:
    """The real ``weight_transport: shared_fs`` path (``weights.delta_fs``), ``weight_delta`` on
    against off: per version, from the TU ranks' export call until the GU's conversion is
    published (write + publish, then apply + write the applied copy + convert for on; write +
    publish, then hard link or merge for off), and the bytes the TU put in the shared folder."""
    from safetensors.torch import load_file

    from mindspeed_rl.weights.store import snapshot_dirname
    from mindspeed_rl.weights.transports import transport_for

    shared_fs = transport_for("shared_fs")
    out: dict[str, list[float]] = {"on_s": [], "off_s": [], "on_bytes": [], "off_bytes": []}
    for kind, delta in KINDS:
        root = Path(tempfile.mkdtemp(dir=tmp, prefix=f"wired-{kind}-"))  # one per call: a fresh run
        writers = [
            shared_fs.exporter(root / "trainer", 2, run_id="bench", delta=delta)
            for _ in range(layout.world_size)
        ]
        gu = shared_fs.gu_end(root / "gu0", delta=delta, gu_id=0)
        try:
            for i, full in enumerate(versions):
                tic = time.perf_counter()
                export_all(writers, layout, i + 1, full)
                folder = root / "trainer" / snapshot_dirname(i + 1)
                nbytes = sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith("rank-"))
                done = gu.convert(i + 1, str(folder))
                seconds = time.perf_counter() - tic
                assert done.path is not None
                assert_bits(load_file(str(Path(done.path) / "rank-00000.safetensors")), full, (kind, i))
                if i > 0:
                    out[f"{kind}_s"].append(seconds)
                    out[f"{kind}_bytes"].append(float(nbytes))
        finally:
            for w in writers:
                w.close()
    return summary(out, warm)


def object_store_case(
    layout: TrainingLayout, versions: list[dict[str, torch.Tensor]], warm: int = 0
) -> dict[str, Any]:
    """The real ``weight_transport: object_store`` path (``weights.delta_object_store``),
    ``weight_delta`` on against off, on a local Ray instance: per version, from the TU ranks'
    export call until the GU offers the snapshot to its actors (put + announce, then the GU's
    check for off; encode + put of the packed delta, then fetch + apply + put of the applied copy
    for on), and the bytes the TU put. Checked bit for bit through the actors' reader."""
    from mindspeed_rl.weights.transport import memory_path
    from mindspeed_rl.weights.transports import transport_for
    from mindspeed_rl.weights.transports.base import memory_reader

    store = transport_for("object_store")
    out: dict[str, list[float]] = {"on_s": [], "off_s": [], "on_bytes": [], "off_bytes": []}
    for kind, delta in KINDS:
        run_id = f"bench-{kind}-{layout.world_size}-{time.monotonic_ns()}"
        writers = [
            store.exporter(Path("/nonexistent"), 2, run_id=run_id, delta=delta)
            for _ in range(layout.world_size)
        ]
        gu = store.gu_end(Path("/nonexistent"), delta=delta, gu_id=0)
        try:
            for i, full in enumerate(versions):
                tic = time.perf_counter()
                results = export_all(writers, layout, i + 1, full)
                (handle,) = [r.handle for r in results if r.handle is not None]
                done = gu.convert(i + 1, memory_path(i + 1), handle)
                seconds = time.perf_counter() - tic
                assert done.path is not None
                weights, _ = memory_reader(gu.reload_handle(done.path))()
                assert_bits(dict(weights), full, (kind, i))
                del weights
                if i > 0:
                    out[f"{kind}_s"].append(seconds)
                    out[f"{kind}_bytes"].append(float(sum(r.bytes_written for r in results)))
        finally:
            close_all(writers)
    return summary(out, warm)


class _GuOnAnotherNode:
    """A GU of ``object_store`` and one actor-side reader, in a Ray actor on the second node."""

    def __init__(self, delta: DeltaSettings | None) -> None:
        from mindspeed_rl.weights.transports import transport_for

        self.gu = transport_for("object_store").gu_end(Path("/nonexistent"), delta=delta, gu_id=0)

    def refresh(self, version: int, path: str, handle: Any) -> dict[str, int]:
        """Convert, then read the version as an actor on this node does (the fetch and, for a TP
        merge, the merge); the xxh3_64 of each loaded tensor's bits, for the driver to check."""
        from mindspeed_rl.weights.transports.base import memory_reader

        done = self.gu.convert(version, path, handle)
        assert done.path is not None
        weights, _ = memory_reader(self.gu.reload_handle(done.path))()
        return digests(weights)


def digests(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, int]:
    """xxh3_64 of each tensor's bits (what the two-node case compares across processes)."""
    return {name: checksum(words(t, copy=False), "xxh3_64") for name, t in named}


def object_store_two_node_case(
    layout: TrainingLayout, versions: list[dict[str, torch.Tensor]], warm: int = 0
) -> dict[str, Any]:
    """``weight_transport: object_store`` with the GU on another node of a Ray test cluster (two
    raylets on this host; Ray's object manager moves objects between their stores over loopback
    TCP, what a cluster does over its network). Per version, from the TU ranks' export call (in
    this driver, on the head node) until a reader on the GU's node has loaded it: for off the
    GU's check, then the reader's fetch of every byte across nodes; for on the GU's fetch of the
    packed deltas, its apply and its put on its own node, then the reader's local fetch. Both
    include the reader's merge for TP2 -> TP1 (object_store's actors merge). Checked bit for
    bit (xxh3_64 of each loaded tensor against the trainer's)."""
    import ray
    from ray.cluster_utils import Cluster

    from mindspeed_rl.weights.transport import memory_path
    from mindspeed_rl.weights.transports import transport_for

    store = transport_for("object_store")
    expected = [digests(full.items()) for full in versions]
    out: dict[str, list[float]] = {"on_s": [], "off_s": [], "on_bytes": [], "off_bytes": []}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 3 * 10**9})
    cluster.add_node(num_cpus=1, resources={"gu_node": 1}, object_store_memory=3 * 10**9)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        remote_gu: Any = ray.remote(num_cpus=0, resources={"gu_node": 1})(_GuOnAnotherNode)
        for kind, delta in KINDS:
            run_id = f"bench-xnode-{kind}-{layout.world_size}-{time.monotonic_ns()}"
            writers = [
                store.exporter(Path("/nonexistent"), 2, run_id=run_id, delta=delta)
                for _ in range(layout.world_size)
            ]
            gu = remote_gu.remote(delta)
            try:
                for i, full in enumerate(versions):
                    tic = time.perf_counter()
                    results = export_all(writers, layout, i + 1, full)
                    (handle,) = [r.handle for r in results if r.handle is not None]
                    loaded = ray.get(gu.refresh.remote(i + 1, memory_path(i + 1), handle))
                    seconds = time.perf_counter() - tic
                    assert loaded == expected[i], (kind, i)  # exact: what the reader loaded
                    if i > 0:
                        out[f"{kind}_s"].append(seconds)
                        out[f"{kind}_bytes"].append(float(sum(r.bytes_written for r in results)))
            finally:
                close_all(writers)
                ray.kill(gu)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return summary(out, warm)


def collective_case(
    layout: TrainingLayout, versions: list[dict[str, torch.Tensor]], bucket_mb: float, warm: int = 0
) -> dict[str, Any]:
    """The real ``weight_transport: collective`` path (``weights.delta_collective``), ``weight_delta``
    on against off, over a gloo group per GU (TU ranks and the GU's receiver on threads of this
    process, on a local Ray instance for the GU's puts): per version, from the TU ranks' export
    call until the GU offers the snapshot to its actors (pack + send, then receive + convert per
    bucket + put for off; the GU's answer, encode + pack + send of the packed delta, then receive +
    apply + put of the applied copy for on), and the bytes the TU sent. Checked bit for bit through
    the actors' reader."""
    from mindspeed_rl.weights.transport import memory_path
    from mindspeed_rl.weights.transports import transport_for
    from mindspeed_rl.weights.transports.base import memory_reader

    coll = transport_for("collective")
    out: dict[str, list[float]] = {"on_s": [], "off_s": [], "on_bytes": [], "off_bytes": []}
    for kind, delta in KINDS:
        run_id = f"bench-coll-{kind}-{layout.world_size}-{time.monotonic_ns()}"
        gu = coll.gu_end(Path("/nonexistent"), delta=delta, gu_id=0)
        channel = gu.open_channel(0, layout.world_size + 1, "gloo")
        writers = [
            coll.exporter(
                Path("/nonexistent"), 2, run_id=run_id, channels=[channel], bucket_mb=bucket_mb, delta=delta
            )
            for _ in range(layout.world_size)
        ]
        try:
            for i, full in enumerate(versions):
                sent_before = sum(w.stats()["collective_bytes_sent"] for w in writers)
                tic = time.perf_counter()
                export_all(writers, layout, i + 1, full)
                done = gu.convert(i + 1, memory_path(i + 1))
                seconds = time.perf_counter() - tic
                assert done.path is not None
                weights, _ = memory_reader(gu.reload_handle(done.path))()
                assert_bits(dict(weights), full, (kind, i))
                del weights
                if i > 0:
                    out[f"{kind}_s"].append(seconds)
                    out[f"{kind}_bytes"].append(
                        sum(w.stats()["collective_bytes_sent"] for w in writers) - sent_before
                    )
        finally:
            close_all(writers)
    return summary(out, warm)


def summary(all_refreshes: dict[str, list[float]], warm: int = 0) -> dict[str, Any]:
    """Medians over the refreshes after the first ``warm`` (each list keeps them all)."""
    if warm >= len(all_refreshes["on_s"]):
        raise SystemExit(
            f"--warm-refreshes {warm} leaves no refresh of {len(all_refreshes['on_s'])}: add --steps"
        )
    out = {key: values[warm:] for key, values in all_refreshes.items()}
    return {
        "per_refresh": all_refreshes,
        "warm_refreshes": warm,
        "delta_s": statistics.median(out["on_s"]),
        "full_s": statistics.median(out["off_s"]),
        "seconds_ratio": statistics.median(d / f for d, f in zip(out["on_s"], out["off_s"], strict=True)),
        "bytes_ratio": statistics.median(
            d / f for d, f in zip(out["on_bytes"], out["off_bytes"], strict=True)
        ),
        "delta_bytes": statistics.median(out["on_bytes"]),
        "full_bytes": statistics.median(out["off_bytes"]),
    }
