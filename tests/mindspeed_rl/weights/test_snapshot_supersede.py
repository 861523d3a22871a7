"""At most one export is written and one waits; a newer one replaces the waiting one."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch

from mindspeed_rl.weights import export as export_module
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import TrainingLayout, hf_dense_rules
from mindspeed_rl.weights.store import list_published


class SlowWrites:
    """Wraps write_shard: each write blocks until released, so exports pile up behind it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started = threading.Semaphore(0)
        self.release = threading.Event()
        self.versions: list[str] = []
        real = export_module.write_shard

        def slow(path, tensors, specs, **kwargs):
            self.versions.append(path.parent.name)
            self.started.release()
            assert self.release.wait(10), "test never released the write"
            return real(path, tensors, specs, **kwargs)

        monkeypatch.setattr(export_module, "write_shard", slow)

    def wait_started(self) -> None:
        assert self.started.acquire(timeout=10), "the writer thread never started a write"


class CloneTracker:
    """Weak references to every clone made by export, per version."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.refs: dict[int, list[weakref.ref[torch.Tensor]]] = {}
        real = SnapshotWriter._payload

        def tracked(writer, version, chosen, layout, rank):
            prepared = real(writer, version, chosen, layout, rank)
            self.refs[version] = [weakref.ref(t) for t in prepared.tensors.values()]
            return prepared

        monkeypatch.setattr(SnapshotWriter, "_payload", tracked)

    def alive(self) -> list[int]:
        gc.collect()
        return sorted(v for v, refs in self.refs.items() if any(r() is not None for r in refs))


def test_newer_export_supersedes_the_queued_one_and_memory_holds_two_copies(
    tmp_path, tiny_model, monkeypatch
):
    slow, clones = SlowWrites(monkeypatch), CloneTracker(monkeypatch)
    writer = SnapshotWriter(tmp_path, keep_last=5)
    first = writer.export(1, tiny_model.items(), TrainingLayout())
    slow.wait_started()  # v1 is being written
    second = writer.export(2, tiny_model.items(), TrainingLayout())
    assert not second.done() and clones.alive() == [1, 2]
    third = writer.export(3, tiny_model.items(), TrainingLayout())
    assert second.done() and second.result().superseded and second.result().published is None
    assert clones.alive() == [1, 3], "the superseded clone is dropped"
    fourth = writer.export(4, tiny_model.items(), TrainingLayout())
    assert third.result().superseded and clones.alive() == [1, 4]
    assert writer.num_superseded == 2

    slow.release.set()
    writer.close()
    assert first.result().published is not None and fourth.result().published is not None
    assert not first.result().superseded and not fourth.result().superseded
    assert slow.versions == [".staging-v1", ".staging-v4"]
    assert [i.version for i in list_published(tmp_path)] == [1, 4]
    assert clones.alive() == []


def test_without_a_backlog_nothing_is_superseded(tmp_path, tiny_model):
    writer = SnapshotWriter(tmp_path, keep_last=5)
    for version in range(3):
        assert writer.export(version, tiny_model.items(), TrainingLayout()).result().published is not None
    writer.close()
    assert writer.num_superseded == 0


def test_ranks_of_one_version_do_not_supersede_each_other(tmp_path, tiny_model, monkeypatch):
    slow = SlowWrites(monkeypatch)
    layout = TrainingLayout(tp_size=2, rules=hf_dense_rules())
    writer = SnapshotWriter(tmp_path)
    rank0_v1 = writer.export(1, tiny_model.items(), layout, rank=0)
    slow.wait_started()
    rank1_v1 = writer.export(1, tiny_model.items(), layout, rank=1)
    rank0_v2 = writer.export(2, tiny_model.items(), layout, rank=0)  # queued beside rank 1's, not instead
    assert writer.num_superseded == 0
    slow.release.set()
    assert rank0_v1.result().published is None and rank1_v1.result().published is not None
    assert rank0_v2.result().published is None  # waits for rank 1 of v2
    assert writer.export(2, tiny_model.items(), layout, rank=1).result().published is not None
    writer.close()
    assert [i.version for i in list_published(tmp_path)] == [1, 2]


def test_a_failed_write_reaches_the_caller_and_the_writer_goes_on(tmp_path, tiny_model, monkeypatch):
    real = export_module.write_shard
    calls = []

    def fail_once(path, tensors, specs, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            raise OSError("disk full")
        return real(path, tensors, specs, **kwargs)

    monkeypatch.setattr(export_module, "write_shard", fail_once)
    writer = SnapshotWriter(tmp_path)
    with pytest.raises(OSError, match="disk full"):
        writer.export(1, tiny_model.items(), TrainingLayout()).result()
    assert writer.export(2, tiny_model.items(), TrainingLayout()).result().published is not None
    writer.close()


def test_versions_must_increase_per_rank_and_close_is_final(tmp_path, tiny_model):
    writer = SnapshotWriter(tmp_path)
    writer.export(3, tiny_model.items(), TrainingLayout()).result()
    with pytest.raises(ValueError, match="export version 4 or later"):
        writer.export(2, tiny_model.items(), TrainingLayout())
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        writer.export(5, tiny_model.items(), TrainingLayout())
