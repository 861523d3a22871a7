"""A reused snapshot folder cannot make one run delete or reuse another run's snapshots."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from mindspeed_rl.weights.convert import GuConverter
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout
from mindspeed_rl.weights.manifest import SnapshotInfo
from mindspeed_rl.weights.reload import ReloadPolicy
from mindspeed_rl.weights.store import list_published, list_run_published, run_root


def _run(root: Path, run_id: str, versions: list[int], model: dict[str, torch.Tensor]) -> list:
    writer = SnapshotWriter(root, keep_last=2, run_id=run_id)
    results = [writer.export(v, model.items(), TrainingLayout()).result() for v in versions]
    writer.close()
    return results


def test_two_runs_in_a_row_into_one_snapshot_dir_both_keep_their_newest(tmp_path, model_factory):
    for run_id, versions in (("run-a", [197, 198, 199]), ("run-b", [1, 2, 3])):
        root = run_root(tmp_path, run_id)
        writer = SnapshotWriter(root / "trainer", keep_last=2, run_id=run_id)
        converter = GuConverter(root / "gu0", InferenceLayout(), keep_last=2)
        for version in versions:
            published = writer.export(version, model_factory(version).items(), TrainingLayout()).result()
            assert published.published is not None
            converter.convert(published.published)
        writer.close()
    for run_id, kept in (("run-a", [198, 199]), ("run-b", [2, 3])):
        assert [i.version for i in list_published(tmp_path / run_id / "trainer")] == kept
        assert [i.version for i in list_published(tmp_path / run_id / "gu0")] == kept


def test_leftover_v197_in_the_same_root_no_longer_deletes_the_new_v1(tmp_path, model_factory, caplog):
    _run(tmp_path, "earlier-run", [197, 198, 199], model_factory(0))
    with caplog.at_level(logging.WARNING):
        first = _run(tmp_path, "new-run", [1], model_factory(1))[0]
    assert any("v198,199 of other runs" in r.getMessage() for r in caplog.records)
    assert first.published is not None and first.pruned_versions == ()
    assert first.published.path.is_dir()
    engine: dict[str, torch.Tensor] = {}
    assert ReloadPolicy(0).maybe_reload(first.published, engine.update).status == "loaded"

    later = _run(tmp_path, "new-run", [2, 3], model_factory(2))
    assert later[-1].pruned_versions == (1,)  # the new run's retention counts its own versions only
    assert [i.version for i in list_run_published(tmp_path, "new-run")] == [2, 3]
    assert [i.version for i in list_run_published(tmp_path, "earlier-run")] == [198, 199]


def test_gu_cache_never_reuses_another_runs_conversion_of_the_same_version(tmp_path, model_factory):
    converter = GuConverter(tmp_path / "gu0", InferenceLayout())
    old = _run(tmp_path / "old", "old", [1], model_factory(100))[0].published
    new = _run(tmp_path / "new", "new", [1], model_factory(1))[0].published
    assert converter.convert(old).method == "linked"
    result = converter.convert(new)
    assert not result.reused and result.method == "linked"
    engine: dict[str, torch.Tensor] = {}
    ReloadPolicy(0).maybe_reload(converter.latest(), lambda named: engine.update(dict(named)))
    for name, tensor in model_factory(1).items():
        assert torch.equal(engine[name], tensor), name
    assert converter.convert(new).reused


def test_publishing_over_another_runs_version_names_the_folder_and_the_fix(tmp_path, tiny_model):
    _run(tmp_path, "earlier-run", [5], tiny_model)
    writer = SnapshotWriter(tmp_path, run_id="new-run")
    with pytest.raises(ValueError, match=r"already published \(by run 'earlier-run'\).*own folder"):
        writer.export(5, tiny_model.items(), TrainingLayout()).result()
    with pytest.raises(ValueError, match="already published"):
        writer.close()  # close re-raises a failed write too (the TU's finish_snapshots relies on it)


def test_run_root_refuses_ids_that_are_not_one_folder_name(tmp_path):
    assert run_root(tmp_path, "20261201-090000_grpo_tiny_asp") == tmp_path / "20261201-090000_grpo_tiny_asp"
    for bad in ("", "../x", ".hidden", "a/b"):
        with pytest.raises(ValueError, match="one path component"):
            run_root(tmp_path, bad)


def test_announced_snapshot_info_is_path_based(tmp_path, tiny_model):
    """The CU announces (version, path); run scoping must not change that contract."""
    info = _run(tmp_path, "r", [4], tiny_model)[0].published
    assert info == SnapshotInfo(version=4, path=tmp_path / "v4")


def test_the_async_pipeline_puts_each_run_under_its_own_snapshot_folder(tmp_path):
    """``trainer/async_cluster.snapshot_root`` is where TU export root and GU caches get their run id."""
    from mindspeed_rl.trainer.async_cluster import snapshot_root

    runs = [tmp_path / "runs" / name for name in ("20261201-090000_grpo", "20261201-100000_grpo")]
    shared = [snapshot_root(str(tmp_path / "snapshots"), run) for run in runs]
    assert shared == [tmp_path / "snapshots" / run.name for run in runs]
    assert snapshot_root(None, runs[0]) == runs[0] / "snapshots"
