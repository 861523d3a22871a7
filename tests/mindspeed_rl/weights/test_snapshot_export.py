from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mindspeed_rl.weights import export as export_module
from mindspeed_rl.weights.convert import GuConverter
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout, hf_dense_rules
from mindspeed_rl.weights.manifest import SnapshotInfo, SnapshotManifest
from mindspeed_rl.weights.reload import ReloadPolicy
from mindspeed_rl.weights.store import latest_published, lease, list_published

SINGLE = TrainingLayout()


def _assert_same(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype, name
        assert torch.equal(actual[name], tensor), name


def _collect(into: dict[str, torch.Tensor]):
    def load(named):
        into.update(dict(named))

    return load


def test_round_trip_export_convert_reload_is_bit_exact(tmp_path, tiny_model):
    writer = SnapshotWriter(tmp_path / "export", keep_last=2)
    result = writer.export(1, tiny_model.items(), SINGLE, rank=0).result()
    writer.close()
    assert result.published == latest_published(tmp_path / "export")
    assert result.bytes_written > sum(t.numel() * t.element_size() for t in tiny_model.values())
    assert result.num_tensors == len(tiny_model)
    assert result.published is not None

    converter = GuConverter(tmp_path / "gu0", InferenceLayout())
    converted = converter.convert(result.published)
    assert not converted.reused and converted.converted.version == 1
    assert converter.convert(result.published).reused  # once per GU per snapshot

    engine: dict[str, torch.Tensor] = {}
    reload = ReloadPolicy(0).maybe_reload(converter.latest(), _collect(engine))
    assert reload.status == "loaded" and reload.version == 1
    assert reload.nbytes == sum(t.numel() * t.element_size() for t in tiny_model.values())
    _assert_same(engine, tiny_model)


def test_single_rank_training_snapshot_loads_without_conversion(tmp_path, tiny_model):
    writer = SnapshotWriter(tmp_path, keep_last=1)
    info = writer.export(3, tiny_model.items(), SINGLE).result().published
    assert info is not None
    engine: dict[str, torch.Tensor] = {}
    assert ReloadPolicy(2).maybe_reload(info, _collect(engine)).status == "loaded"
    _assert_same(engine, tiny_model)


def test_export_copies_tensors_before_returning(tmp_path, tiny_model):
    original = {k: v.clone() for k, v in tiny_model.items()}
    writer = SnapshotWriter(tmp_path)
    future = writer.export(0, tiny_model.items(), SINGLE)
    for tensor in tiny_model.values():  # the next optimizer step, racing the writer thread
        tensor.add_(1)
    info = future.result().published
    assert info is not None
    engine: dict[str, torch.Tensor] = {}
    ReloadPolicy(-1).maybe_reload(info, _collect(engine))
    _assert_same(engine, original)


def test_crash_before_publish_leaves_no_published_dir(tmp_path, tiny_model, monkeypatch):
    def crash(*args, **kwargs):
        raise OSError("simulated crash between shard write and publish")

    monkeypatch.setattr(export_module, "publish_dir", crash)
    writer = SnapshotWriter(tmp_path)
    with pytest.raises(OSError, match="simulated crash"):
        writer.export(5, tiny_model.items(), SINGLE).result()
    assert not (tmp_path / "v5").exists()
    assert latest_published(tmp_path) is None
    assert list(tmp_path.glob(".tmp-v5-*")), "the half-assembled snapshot stays in a hidden temp dir"


def test_publish_waits_for_every_rank(tmp_path, tiny_model):
    layout = TrainingLayout(tp_size=2, rules=hf_dense_rules())
    writer = SnapshotWriter(tmp_path)
    first = writer.export(2, tiny_model.items(), layout, rank=0).result()
    assert first.published is None and latest_published(tmp_path) is None
    second = writer.export(2, tiny_model.items(), layout, rank=1).result()
    assert second.published is not None and second.published.version == 2
    manifest = SnapshotManifest.load(second.published.path)
    assert [s.rank for s in manifest.shards] == [0, 1]
    # Replicated tensors (norms, the counter) are written once, by TP rank 0.
    assert second.num_replicas_skipped == 3
    assert not (tmp_path / ".staging-v2").exists()


def test_a_rank_claiming_while_a_publish_is_cleared_finds_nothing(tmp_path, tiny_model, monkeypatch):
    """Two ranks can both list every record of a version; the one that claims it publishes, then
    clears the staging folder. rmtree unlinks the claim first, so a rank that claims during that
    clean-up must find no staging folder at all, not one it can claim and publish again (a CI run
    of the delta tests failed reading a record deleted under it)."""
    layout = TrainingLayout(tp_size=2, rules=hf_dense_rules())
    writer = SnapshotWriter(tmp_path)
    calls, late = [], []
    original = writer._publish_if_complete

    def recording(staging, pending):
        calls.append((staging, pending))
        return original(staging, pending)

    real_rmtree = shutil.rmtree

    def rmtree_with_a_late_rank(path, *args, **kwargs):
        (Path(path) / ".publishing").unlink(missing_ok=True)  # where rmtree starts
        late.append(original(*calls[-1]))  # the other rank, which listed both records before
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(writer, "_publish_if_complete", recording)
    writer.export(2, tiny_model.items(), layout, rank=0).result()
    monkeypatch.setattr(shutil, "rmtree", rmtree_with_a_late_rank)
    second = writer.export(2, tiny_model.items(), layout, rank=1).result()
    monkeypatch.undo()
    assert second.published is not None and late == [None]
    manifest = SnapshotManifest.load(second.published.path)
    assert [s.rank for s in manifest.shards] == [0, 1]
    assert not list(tmp_path.glob(".staging-v2*")) and not list(tmp_path.glob(".trash-*"))


def test_retention_keeps_last_k_and_spares_leased(tmp_path, tiny_model):
    writer = SnapshotWriter(tmp_path, keep_last=2)
    for version in range(4):  # one at a time: exports queued behind a write would be superseded
        writer.export(version, tiny_model.items(), SINGLE).result()
    assert [i.version for i in list_published(tmp_path)] == [2, 3]

    with lease(SnapshotInfo(version=2, path=tmp_path / "v2")):
        writer.export(4, tiny_model.items(), SINGLE).result()
        assert [i.version for i in list_published(tmp_path)] == [2, 3, 4]
    pruned = writer.export(5, tiny_model.items(), SINGLE).result().pruned_versions
    writer.close()
    assert sorted(pruned) == [2, 3]
    assert [i.version for i in list_published(tmp_path)] == [4, 5]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".staging", ".tmp", ".trash"))]


def test_manifest_json_round_trip_and_schema_check(tmp_path, tiny_model):
    writer = SnapshotWriter(tmp_path)
    info = writer.export(1, tiny_model.items(), SINGLE).result().published
    assert info is not None
    manifest = SnapshotManifest.load(info.path)
    assert SnapshotManifest.from_json(json.loads(manifest.dumps())) == manifest
    entry = {t.name: t for t in manifest.tensors}["model.layers.0.mlp.gate_proj.weight"]
    assert entry.dtype == "bfloat16" and entry.shape == (12, 8) and entry.nbytes == 12 * 8 * 2
    data = json.loads(manifest.dumps())
    data["schema_version"] = 99
    with pytest.raises(ValueError, match="schema_version 99"):
        SnapshotManifest.from_json(data)


def test_user_errors_name_the_fix(tmp_path, tiny_model):
    writer = SnapshotWriter(tmp_path)
    writer.export(1, tiny_model.items(), SINGLE).result()
    with pytest.raises(ValueError, match="export version 2 or later"):
        writer.export(1, tiny_model.items(), SINGLE).result()
    with pytest.raises(ValueError, match="given twice"):
        writer.export(3, [("a", torch.zeros(1)), ("a", torch.zeros(1))], SINGLE)
    with pytest.raises(ValueError, match="rank 2 is outside"):
        writer.export(3, tiny_model.items(), TrainingLayout(tp_size=2), rank=2)
    with pytest.raises(ValueError, match="keep_last"):
        SnapshotWriter(tmp_path, keep_last=0)


def test_manifest_layout_and_store_import_without_torch():
    code = (
        "import sys\n"
        "import mindspeed_rl.weights.manifest, mindspeed_rl.weights.store\n"
        "assert 'torch' not in sys.modules, 'the CU must read manifests without torch'\n"
    )
    root = Path(__file__).resolve().parents[4]
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}
    )
