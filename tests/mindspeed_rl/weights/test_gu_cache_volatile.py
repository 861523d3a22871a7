"""A GU cache written without fsync (``GuConverter(durable=False)``, what ``shared_fs``'s GU
uses): each folder records the boot it was written in, and one written before the host
restarted is neither reused nor offered as the latest, but converted again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from mindspeed_rl.weights import shardio, store
from mindspeed_rl.weights.convert import GuConverter
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout, hf_dense_rules
from mindspeed_rl.weights.reload import ReloadPolicy

pytestmark = pytest.mark.skipif(store.boot_id() is None, reason="needs Linux's boot id")


def _export(root: Path, model: dict[str, torch.Tensor], layout: TrainingLayout, version: int = 1):
    writers = [SnapshotWriter(root, run_id="run") for _ in range(layout.world_size)]
    futures = []
    for rank, writer in enumerate(writers):
        mine = {}
        for name, t in model.items():
            spec = layout.spec_for(name)
            if spec.tp_dim is not None:
                t = t.chunk(layout.tp_size, dim=spec.tp_dim)[layout.coords(rank).tp_rank].contiguous()
            mine[name] = t
        futures.append(writer.export(version, mine.items(), layout, rank))
    published = [f.result().published for f in futures]
    for w in writers:
        w.close()
    (info,) = [p for p in published if p is not None]
    return info


def test_a_merge_is_written_without_fsync_and_marked_with_this_boot(tmp_path, tiny_model, monkeypatch):
    snapshot = _export(tmp_path / "trainer", tiny_model, TrainingLayout(tp_size=2, rules=hf_dense_rules()))
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(shardio.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    monkeypatch.setattr(store.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    converter = GuConverter(tmp_path / "gu", InferenceLayout(), durable=False)
    result = converter.convert(snapshot)
    assert result.method == "merged" and synced == []
    marker = result.converted.path / store.VOLATILE_MARKER
    assert marker.read_text() == store.boot_id()
    engine: dict[str, torch.Tensor] = {}
    latest = converter.latest()
    assert latest is not None and latest.version == 1
    assert ReloadPolicy(0).maybe_reload(latest, lambda named: engine.update(dict(named))).status == "loaded"
    for name, tensor in tiny_model.items():
        assert torch.equal(engine[name], tensor), name
    assert converter.convert(snapshot).reused  # the same boot: reused


def test_a_folder_of_an_earlier_boot_is_converted_again(tmp_path, tiny_model):
    snapshot = _export(tmp_path / "trainer", tiny_model, TrainingLayout())
    converter = GuConverter(tmp_path / "gu", InferenceLayout(), durable=False)
    first = converter.convert(snapshot)
    (first.converted.path / store.VOLATILE_MARKER).write_text("another-boot")  # the host restarted
    assert converter.latest() is None, "bytes written before a host crash are not offered"
    again = converter.convert(snapshot)
    assert not again.reused and again.method == "linked"
    assert (again.converted.path / store.VOLATILE_MARKER).read_text() == store.boot_id()
    assert converter.latest() == again.converted


def test_a_durable_cache_still_fsyncs_and_has_no_marker(tmp_path, tiny_model, monkeypatch):
    snapshot = _export(tmp_path / "trainer", tiny_model, TrainingLayout(tp_size=2, rules=hf_dense_rules()))
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(shardio.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    result = GuConverter(tmp_path / "gu", InferenceLayout()).convert(snapshot)
    assert synced and not (result.converted.path / store.VOLATILE_MARKER).exists()
