"""object_store and collective transports: the same snapshot contract as the files, no file.

Real Ray (a local instance), real gloo groups (two in one process, on threads). Each case checks
what the engine would be handed, tensor by tensor, against what the trainer exported (identity)
or against the file converter's output for the same shards (the TP2 -> TP1 merge).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from mindspeed_rl.weights.collective import ChannelAddress, CollectiveSender, open_store
from mindspeed_rl.weights.collective_receiver import CollectiveReceiver, ReceivedSnapshots
from mindspeed_rl.weights.convert import convert_snapshot
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout, hf_dense_rules
from mindspeed_rl.weights.manifest import SnapshotError
from mindspeed_rl.weights.memory_snapshot import MemorySnapshot
from mindspeed_rl.weights.object_store import ObjectStoreExporter
from mindspeed_rl.weights.transport import (
    SharedPathError,
    check_probe,
    memory_path,
    write_probe,
)
from mindspeed_rl.weights.transports import transport_for
from mindspeed_rl.weights.transports.base import memory_reader
from tests.support.ray_cluster import init_in_process

pytestmark = pytest.mark.integration
TP2 = TrainingLayout(tp_size=2, rules=hf_dense_rules())


@pytest.fixture(scope="module")
def ray_local():
    import ray

    init_in_process(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def tp_shard(model: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in model.items():
        spec = TP2.spec_for(name)
        out[name] = tensor.chunk(2, spec.tp_dim)[rank].contiguous() if spec.tp_dim is not None else tensor
    return out


def loaded(handle: MemorySnapshot) -> dict[str, torch.Tensor]:
    """What an actor's engine is handed: the reader's iterator, drained."""
    weights, _ = memory_reader(handle)()
    return {name: tensor.clone() for name, tensor in weights}


def file_merge(tmp_path: Path, model: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    writers = [SnapshotWriter(tmp_path / "files", keep_last=1, run_id="ref") for _ in range(2)]
    results = [w.export(1, tp_shard(model, r).items(), TP2, rank=r).result() for r, w in enumerate(writers)]
    for w in writers:
        w.close()
    published = next(r.published for r in results if r.published is not None)
    return convert_snapshot(published, InferenceLayout()).per_rank[0]


def test_object_store_identity_hands_the_exported_tensors_to_the_engine(ray_local, tiny_model) -> None:
    exporter = ObjectStoreExporter(keep_last=2, run_id="t1")
    result = exporter.export(1, tiny_model.items(), TrainingLayout()).result()
    exporter.close()
    assert result.published is not None and not result.superseded
    handle = result.handle
    assert isinstance(handle, MemorySnapshot) and handle.version == 1
    gu = transport_for("object_store").gu_end(Path("/nonexistent-never-created"))
    done = gu.convert(1, memory_path(1), handle)
    assert done.path == memory_path(1) and gu.reload_handle(done.path) is handle
    got = loaded(handle)
    assert got.keys() == tiny_model.keys()
    for name, tensor in tiny_model.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_object_store_merge_matches_the_file_converter(ray_local, tiny_model, tmp_path: Path) -> None:
    exporters = [ObjectStoreExporter(keep_last=2, run_id="merge-run") for _ in range(2)]
    futures = [e.export(1, tp_shard(tiny_model, r).items(), TP2, rank=r) for r, e in enumerate(exporters)]
    results = [f.result(timeout=60) for f in futures]
    for e in exporters:
        e.close()
    handles = [r.handle for r in results if r.handle is not None]
    assert len(handles) == 1, "exactly one rank (the last in) announces the snapshot"
    got = loaded(handles[0])
    want = file_merge(tmp_path, tiny_model)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    import ray

    from mindspeed_rl.weights.memory_snapshot import fetch_tensors, iter_converted

    threaded = dict(
        iter_converted(handles[0], fetch_tensors(handles[0], ray.get), InferenceLayout(), num_threads=2)
    )
    assert all(torch.equal(threaded[name], want[name]) for name in want)


def test_object_store_keeps_only_its_newest_versions(ray_local, model_factory) -> None:
    """Ray frees an object once no process references it; the exporter's part is to let go of
    every version but its newest ``keep_last`` (the CU and GUs keep only the newest announced)."""
    exporter = ObjectStoreExporter(keep_last=2, run_id="ret")
    records = [exporter.export(v, model_factory(v).items(), TrainingLayout()).result() for v in range(1, 5)]
    stats = exporter.store_stats()
    exporter.close()
    assert sorted(exporter._held) == [3, 4]
    assert stats["object_store_versions_held"] == 2 and stats["object_store_versions_released"] == 2
    assert stats["object_store_bytes_held"] == sum(r.handle.nbytes for r in records[2:])
    # At a publish the new version is in before the oldest is let go: keep_last + 1 at most.
    assert stats["object_store_peak_bytes_held"] == max(
        sum(r.handle.nbytes for r in records[i : i + 3]) for i in range(2)
    )
    assert all(shard is not records[0].handle.shards[0] for shard in exporter._held.values())


def test_a_defective_memory_snapshot_is_rejected_before_the_engine(ray_local, tiny_model) -> None:
    import dataclasses

    exporter = ObjectStoreExporter(keep_last=2, run_id="bad")
    handle = exporter.export(1, tiny_model.items(), TrainingLayout()).result().handle
    exporter.close()
    shard = handle.shards[0]
    short = dataclasses.replace(shard, entries=shard.entries[:-1])
    with pytest.raises(SnapshotError, match="arrays for"):
        memory_reader(dataclasses.replace(handle, shards=(short,)))()
    with pytest.raises(SnapshotError, match="announced as 2"):
        transport_for("object_store").gu_end(Path("/x")).convert(2, memory_path(2), handle)


def _collective_pair(layout_ranks: int, bucket_mb: float):
    """A GU receiver and ``layout_ranks`` TU senders in this process; the same code as across nodes."""
    import ray

    store = open_store("127.0.0.1", layout_ranks + 1)
    address = ChannelAddress(
        gu_id=0, host="127.0.0.1", port=int(store.port), world_size=layout_ranks + 1, backend="gloo"
    )
    received = ReceivedSnapshots()
    receiver = CollectiveReceiver(address, store, InferenceLayout(), received, ray.put)
    receiver.start()
    senders = [CollectiveSender([address], bucket_mb=bucket_mb, run_id="coll") for _ in range(layout_ranks)]
    return receiver, received, senders


def test_collective_identity_in_small_buckets_delivers_every_tensor(ray_local, model_factory) -> None:
    receiver, received, (sender,) = _collective_pair(1, bucket_mb=0.0002)  # ~200 bytes: many buckets
    for version in (1, 2, 3):
        model = model_factory(version)
        result = sender.export(version, model.items(), TrainingLayout()).result(timeout=60)
        assert result.handle is not None and result.handle.medium == "collective"
        got_handle = received.wait_for(version, 60)
        assert isinstance(got_handle, MemorySnapshot), got_handle
        assert len(got_handle.shards[0].parts) > 3, "the receiver converts and puts bucket by bucket"
        got = loaded(got_handle)
        for name, tensor in model.items():
            assert torch.equal(got[name], tensor), name
    stats = sender.stats()
    assert stats["collective_groups_created"] == 1.0, "one group, reused for every refresh"
    # Versions 2 and 3 were packed into version 1's buckets and received into buckets freed by
    # earlier rounds: every tensor above still matched its own version.
    assert stats["collective_send_buckets_reused"] >= 2 * stats["collective_send_buckets_allocated"]
    assert receiver._buckets.reused > 0
    sender.close()


def test_collective_merge_per_bucket_matches_the_file_converter(
    ray_local, model_factory, tmp_path: Path
) -> None:
    """Two versions of different weights through many bucket rounds: the receiver merges every
    round into memory it reuses (``hostcopy.Arena``), so a tensor of one round or version that
    still pointed into it would show the next one's bytes."""
    receiver, received, senders = _collective_pair(2, bucket_mb=0.0003)
    for version in (1, 2, 3):
        model = model_factory(version)
        futures: list = []

        def export(r: int, version: int = version, model: dict = model, futures: list = futures) -> None:
            futures.append(senders[r].export(version, tp_shard(model, r).items(), TP2, rank=r))

        threads = [threading.Thread(target=export, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got_handle = received.wait_for(version, 60)
        assert isinstance(got_handle, MemorySnapshot), got_handle
        assert len(got_handle.shards[0].parts) > 3, "merged and put round by round"
        got = loaded(got_handle)
        want = file_merge(tmp_path / f"v{version}", model)
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (version, name)
        for f in futures:
            f.result(timeout=60)
    assert receiver._arena.nbytes > 0, "the merges ran in the reused memory"
    assert receiver._buckets.reused > 0 and all(s.buckets.reused > 0 for s in senders)


def test_probe_refuses_shared_fs_where_the_folder_is_not_shared(tmp_path: Path) -> None:
    probe = write_probe(tmp_path / "node_a")
    shared_fs, object_store = (transport_for(n).needs_shared_folder for n in ("shared_fs", "object_store"))
    assert check_probe(probe, shared_folder=shared_fs, folder=tmp_path / "node_a", where="GU 0")
    with pytest.raises(SharedPathError, match="weight_transport=shared_fs.*node"):
        check_probe(probe, shared_folder=shared_fs, folder=tmp_path / "node_b", where="GU 0")
    assert check_probe(probe, shared_folder=object_store, folder=tmp_path / "node_b", where="GU 0") is False


def test_puts_are_cut_in_order_into_chunks_of_about_equal_bytes() -> None:
    import numpy as np

    from mindspeed_rl.weights.memory_snapshot import _contiguous_chunks

    arrays = [np.zeros(n, dtype=np.uint8) for n in (5, 1, 1, 1, 4, 4)]
    chunks = _contiguous_chunks(arrays, 2)
    assert [a for c in chunks for a in c] == arrays and all(chunks)
    assert [sum(a.nbytes for a in c) for c in chunks] == [8, 8]
    assert _contiguous_chunks(arrays[:1], 4) == [arrays[:1]]
    assert len(_contiguous_chunks(arrays, 10)) <= 6


def test_bucket_pool_reuses_by_size_and_keeps_at_most_its_limit() -> None:
    from mindspeed_rl.weights.collective import BucketPool

    pool = BucketPool(limit_bytes=300)
    a, b, c = pool.take(100), pool.take(100), pool.take(200)
    assert pool.allocated == 3 and pool.reused == 0
    pool.give_back([a, b, c])  # 400 bytes offered, 300 kept: the 200-byte one does not fit
    assert pool.held_bytes == 200
    assert pool.take(100) is b and pool.take(100) is a and pool.reused == 2
    assert pool.take(200) is not c and pool.allocated == 4 and pool.held_bytes == 0


def test_collective_sender_never_reuses_buckets_a_send_still_reads(model_factory) -> None:
    """The trainer exports v2 while v1 is still being sent: v2 must be packed into other memory
    (v1's buckets return to the pool only once their sends are done), or v1's GU would receive
    v2's bytes under v1's header, and no checksum would tell."""
    import time

    from mindspeed_rl.weights.collective_receiver import _unpack

    release, sent = threading.Event(), {}
    address = ChannelAddress(gu_id=0, host="127.0.0.1", port=1, world_size=2, backend="gloo")
    sender = CollectiveSender([address], bucket_mb=0.0005, run_id="slow")

    def slow_send(address, rank, packed) -> None:
        release.wait(30)
        header = packed.header
        sent[header.version] = {
            entry.name: tensor.clone()
            for (first, end, _), bucket in zip(header.buckets, packed.buckets, strict=True)
            for entry, tensor in _unpack(bucket, header.entries[first:end])
        }

    sender._send_one = slow_send  # type: ignore[method-assign]
    models = {v: model_factory(v) for v in (1, 2)}
    first = sender.export(1, models[1].items(), TrainingLayout())
    deadline = time.monotonic() + 30
    while sender._queue and time.monotonic() < deadline:  # v1 taken by the publisher: its send waits
        time.sleep(0.01)
    second = sender.export(2, models[2].items(), TrainingLayout())
    release.set()
    first.result(timeout=30)
    second.result(timeout=30)
    sender.close()
    assert set(sent) == {1, 2}
    for version, model in models.items():
        for name, tensor in model.items():
            assert torch.equal(sent[version][name], tensor), f"v{version} {name} was overwritten"
    assert sender.buckets.allocated > 0
