from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mindspeed_rl.weights import shardio
from mindspeed_rl.weights.convert import GuConverter
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout
from mindspeed_rl.weights.manifest import MANIFEST_NAME, SnapshotError, SnapshotInfo
from mindspeed_rl.weights.reload import ReloadPolicy, ReloadResult
from mindspeed_rl.weights.store import LEASE_DIR, latest_published

SHARD = "rank-00000.safetensors"


class FakeEngine:
    """Stands in for the rollout engine: records what it was asked to load."""

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        self.weights = {k: v.clone() for k, v in weights.items()}
        self.calls = 0

    def load(self, named) -> None:
        self.calls += 1
        self.weights.update({k: v.clone() for k, v in named})

    def load_folder(self, folder: Path) -> None:
        """What a TP > 1 engine's workers do: read the folder themselves."""
        self.load(load_file(str(folder / SHARD)).items())


def _reload(policy: ReloadPolicy, info: SnapshotInfo, engine: FakeEngine, mode: str) -> ReloadResult:
    if mode == "folder":
        return policy.maybe_reload_from_folder(info, engine.load_folder)
    return policy.maybe_reload(info, engine.load)


def _publish(root: Path, versions: list[int], factory: Callable[[int], dict[str, torch.Tensor]]) -> None:
    writer = SnapshotWriter(root, keep_last=len(versions) + 1)
    for version in versions:  # waited one by one: a queued export would be superseded by the next
        writer.export(version, factory(version).items(), TrainingLayout()).result()
    writer.close()


def _truncate(path: Path) -> None:
    shard = path / SHARD
    os.truncate(shard, shard.stat().st_size - 16)


def _flip_last_byte(path: Path) -> None:
    data = bytearray((path / SHARD).read_bytes())
    data[-1] ^= 0x01  # last byte is tensor data; size stays the same so only the checksum can tell
    (path / SHARD).write_bytes(bytes(data))


def _remove_manifest(path: Path) -> None:
    (path / MANIFEST_NAME).unlink()


def _remove_shard(path: Path) -> None:
    (path / SHARD).unlink()


def _wrong_dtype_in_manifest(path: Path) -> None:
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    manifest["tensors"][0]["dtype"] = "float16"
    (path / MANIFEST_NAME).write_text(json.dumps(manifest))


def _wrong_shape_in_manifest(path: Path) -> None:
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    manifest["tensors"][0]["shape"] = [1, 2, 3]
    (path / MANIFEST_NAME).write_text(json.dumps(manifest))


def _flip_first_tensor_byte(path: Path) -> None:
    shard = path / SHARD
    with shard.open("r+b") as handle:  # the first byte after the header: the first tensor's data
        data_start = 8 + int.from_bytes(handle.read(8), "little")
        handle.seek(data_start)
        byte = handle.read(1)[0]
        handle.seek(data_start)
        handle.write(bytes([byte ^ 0x40]))


@pytest.mark.parametrize("mode", ["tensors", "folder"])
@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_truncate, "truncated"),
        (_flip_first_tensor_byte, "checksum"),
        (_flip_last_byte, "checksum"),
        (_remove_manifest, "no manifest.json"),
        (_remove_shard, "missing"),
        (_wrong_dtype_in_manifest, "manifest says float16"),
        (_wrong_shape_in_manifest, r"\[1, 2, 3\]"),
    ],
)
def test_damaged_snapshot_is_never_loaded(tmp_path, model_factory, caplog, damage, reason, mode):
    _publish(tmp_path, [1, 2], model_factory)
    engine = FakeEngine(model_factory(1))
    policy = ReloadPolicy(1)
    damage(tmp_path / "v2")

    with caplog.at_level(logging.ERROR, logger="mindspeed_rl.weights.reload"):
        result = _reload(policy, SnapshotInfo(version=2, path=tmp_path / "v2"), engine, mode)

    assert result.status == "rejected" and result.version == 1 and result.target_version == 2
    assert result.reason is not None and result.load_seconds == 0.0
    assert engine.calls == 0
    for name, tensor in model_factory(1).items():
        assert torch.equal(engine.weights[name], tensor)
    assert policy.version == 1
    assert any("not loading snapshot v2" in r.getMessage() for r in caplog.records)
    assert re.search(reason, result.reason)


def test_rejected_version_is_not_reread(tmp_path, model_factory, caplog):
    _publish(tmp_path, [1], model_factory)
    _flip_last_byte(tmp_path / "v1")
    policy = ReloadPolicy(0)
    engine = FakeEngine({})
    info = SnapshotInfo(version=1, path=tmp_path / "v1")
    with caplog.at_level(logging.ERROR):
        first = policy.maybe_reload(info, engine.load)
        second = policy.maybe_reload(info, engine.load)
    assert first.status == second.status == "rejected" and second.reason == first.reason
    assert len([r for r in caplog.records if "not loading" in r.getMessage()]) == 1


def test_snapshot_without_manifest_is_invisible_to_discovery(tmp_path, model_factory):
    _publish(tmp_path, [1, 2], model_factory)
    _remove_manifest(tmp_path / "v2")
    latest = latest_published(tmp_path)
    assert latest is not None and latest.version == 1


def test_reload_picks_newest_and_skips_older(tmp_path, model_factory):
    _publish(tmp_path, [1, 2, 3], model_factory)
    engine = FakeEngine(model_factory(0))
    policy = ReloadPolicy(0)

    result = policy.maybe_reload(latest_published(tmp_path), engine.load)
    assert result.status == "loaded" and result.version == 3 and engine.calls == 1
    for name, tensor in model_factory(3).items():
        assert torch.equal(engine.weights[name], tensor)
    assert result.load_seconds > 0 and result.nbytes > 0

    again = policy.maybe_reload(latest_published(tmp_path), engine.load)
    assert again.status == "up_to_date" and engine.calls == 1
    older = policy.maybe_reload(SnapshotInfo(version=2, path=tmp_path / "v2"), engine.load)
    assert older.status == "up_to_date" and policy.version == 3
    assert policy.maybe_reload(None, engine.load).status == "no_snapshot"


def test_reload_refused_while_generating(tmp_path, model_factory):
    _publish(tmp_path, [1], model_factory)
    policy = ReloadPolicy(0)
    engine = FakeEngine({})
    with policy.generating(), pytest.raises(RuntimeError, match="between minibatches"):
        policy.maybe_reload(latest_published(tmp_path), engine.load)
    assert engine.calls == 0
    assert policy.maybe_reload(latest_published(tmp_path), engine.load).status == "loaded"


def test_converter_rejects_damaged_snapshot_and_keeps_cache(tmp_path, model_factory, caplog):
    _publish(tmp_path / "export", [1, 2], model_factory)
    converter = GuConverter(tmp_path / "gu", InferenceLayout())
    converter.convert(SnapshotInfo(version=1, path=tmp_path / "export" / "v1"))
    _truncate(tmp_path / "export" / "v2")
    with caplog.at_level(logging.ERROR), pytest.raises(SnapshotError, match="truncated"):
        converter.convert(SnapshotInfo(version=2, path=tmp_path / "export" / "v2"))
    latest = converter.latest()
    assert latest is not None and latest.version == 1
    assert any("rejected" in r.getMessage() for r in caplog.records)


def test_sharded_training_snapshot_must_be_converted_first(tmp_path, model_factory):
    writer = SnapshotWriter(tmp_path)
    layout = TrainingLayout(tp_size=2)
    for rank in (0, 1):
        writer.export(1, model_factory(1).items(), layout, rank=rank)
    writer.close()
    result = ReloadPolicy(0).maybe_reload(latest_published(tmp_path), FakeEngine({}).load)
    assert result.status == "rejected" and result.reason is not None and "GuConverter" in result.reason


def test_folder_reload_verifies_every_byte_keeps_none_and_loads_under_the_lease(
    tmp_path, model_factory, monkeypatch
):
    _publish(tmp_path, [1], model_factory)
    info = SnapshotInfo(version=1, path=tmp_path / "v1")
    checked: list[int] = []
    real_crc = shardio._crc_update
    monkeypatch.setattr(
        shardio, "_crc_update", lambda chunk, crc: checked.append(len(chunk)) or real_crc(chunk, crc)
    )

    def no_tensor(job):  # the folder reload's whole point: the engine's workers read the tensors
        raise AssertionError(f"{job.entry.name} was read into memory")

    monkeypatch.setattr(shardio, "read_tensor", no_tensor)
    engine = FakeEngine({})
    leases: list[list[Path]] = []

    def load_folder(folder: Path) -> None:
        leases.append(list((tmp_path / LEASE_DIR).iterdir()))
        engine.load_folder(folder)

    result = ReloadPolicy(0).maybe_reload_from_folder(info, load_folder)
    size = sum(t.numel() * t.element_size() for t in model_factory(1).values())
    assert result.status == "loaded" and result.version == 1 and result.nbytes == size
    assert sum(checked) == size, "every tensor byte is checksummed once"
    assert max(checked) <= shardio._CHUNK
    assert len(leases) == 1 and [p.name.split(".")[0] for p in leases[0]] == ["v1"], (
        "lease held while loading"
    )
    assert not list((tmp_path / LEASE_DIR).iterdir()), "lease released after"
    for name, tensor in model_factory(1).items():
        assert torch.equal(engine.weights[name], tensor)


def test_folder_reload_refuses_a_snapshot_of_several_files(tmp_path, model_factory):
    from mindspeed_rl.weights.layout import hf_dense_rules

    _publish(tmp_path / "export", [1], model_factory)
    layout = InferenceLayout(tp_size=2, rules=hf_dense_rules())
    converted = GuConverter(tmp_path / "gu", layout).convert(
        SnapshotInfo(version=1, path=tmp_path / "export" / "v1")
    )
    engine = FakeEngine({})
    result = ReloadPolicy(0).maybe_reload_from_folder(converted.converted, engine.load_folder)
    assert result.status == "rejected" and engine.calls == 0
    assert (
        result.reason is not None
        and "2 shard files" in result.reason
        and "InferenceLayout()" in result.reason
    )
