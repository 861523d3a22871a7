"""Delta sync through the real ``shared_fs`` weight path (``weights.delta_fs``): the TU's exporter
(``transport_for("shared_fs").exporter(..., delta=...)``, one per training rank, sharing the
snapshot root and run id as rank processes do), the GU's end (``gu_end(..., delta=...)``: apply to
the host copy, write it, convert with the real ``GuConverter``: hard link or TP/EP merge), then the
converted file actors load, compared bit for bit with the trainer's weights at every version."""

from __future__ import annotations

import logging
from pathlib import Path

import delta_cases as cases
import pytest
import test_weight_delta as codec  # the codec's tests: their trainer, models and layouts
import torch
from safetensors.torch import load_file

from mindspeed_rl.weights.delta_fs import (
    DeltaBaseReport,
    DeltaSettings,
    delta_file,
    read_reports,
    write_report,
)
from mindspeed_rl.weights.delta_wire import pack, unpack
from mindspeed_rl.weights.layout import TrainingLayout
from mindspeed_rl.weights.store import snapshot_dirname
from mindspeed_rl.weights.transports import transport_for
from mindspeed_rl.weights.transports.base import Converted

RUN = "deltarun"


class Path_:
    """One TU (one exporter per rank) and one GU on a snapshot root, as the async cluster lays
    them out (``<snapshots>/trainer`` and ``<snapshots>/gu-<id>``)."""

    def __init__(self, tmp: Path, layout: TrainingLayout, settings: DeltaSettings, *, keep: int = 3) -> None:
        self.root = tmp / "trainer"
        self.layout = layout
        self.settings = settings
        self.keep = keep
        transport = transport_for("shared_fs")
        self.writers = [
            transport.exporter(self.root, keep, run_id=RUN, delta=settings) for _ in range(layout.world_size)
        ]
        self.gu = transport.gu_end(tmp / "gu-0", delta=settings, gu_id=0)

    def export(self, version: int, full: dict[str, torch.Tensor]) -> Path:
        futures = [
            w.export(version, cases.rank_tensors(self.layout, full, rank).items(), self.layout, rank)
            for rank, w in enumerate(self.writers)
        ]
        for f in futures:
            f.result()
        return self.root / snapshot_dirname(version)

    def convert(self, version: int, announced: Path) -> Converted:
        return self.gu.convert(version, str(announced))

    def loaded(self, path: str) -> dict[str, torch.Tensor]:
        return _loaded(path)

    def close(self) -> None:
        for w in self.writers:
            w.close()


def _loaded(converted: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(converted) / "rank-00000.safetensors"))


_assert_exact = cases.assert_exact


@pytest.mark.parametrize(("model", "layout"), cases.CASES)
def test_twenty_versions_through_shared_fs_are_bit_exact(
    tmp_path: Path, model: str, layout: TrainingLayout
) -> None:
    def check(path: Path, done: Converted) -> None:
        # What crossed the shared folder is the packed refreshes, nothing else.
        assert done.metrics is not None
        on_disk = sum((path / delta_file(r)).stat().st_size for r in range(layout.world_size))
        assert on_disk >= done.metrics["delta_bytes_sent"] > 0

    flow = Path_(tmp_path, layout, cases.EVERY_8)
    try:
        cases.run_twenty_versions(flow, model, check)
    finally:
        flow.close()


def test_a_corrupted_delta_file_is_named_then_recovered_by_a_full_resend(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from mindspeed_rl.weights.manifest import SnapshotError

    trainer = codec.Trainer(codec._dense, tied=False)
    flow = Path_(tmp_path, codec.TP2, DeltaSettings(mode="on", full_interval=100))
    corrupt_at, tensor = 5, "model.layers.0.mlp.gate_proj.weight"
    try:
        with caplog.at_level(logging.ERROR, logger="mindspeed_rl.weights.delta_fs"):
            for version in range(1, 9):
                trainer.step()
                full = trainer.export()
                path = flow.export(version, full)
                if version == corrupt_at:  # one bit of one carried word of rank 1's delta file
                    target = path / delta_file(1)
                    refresh = unpack(target.read_bytes())
                    assert not refresh.is_full
                    part = next(p for p in refresh.tensors if p.name == tensor)
                    data = part.data.copy()
                    data[0] ^= 1
                    object.__setattr__(part, "data", data)
                    target.write_bytes(pack(refresh))
                    with pytest.raises(
                        SnapshotError, match=rf"v{corrupt_at}: tensor {tensor} does not match"
                    ):
                        flow.gu.convert(version, str(path))
                    (report,) = read_reports(flow.root)
                    assert report == DeltaBaseReport(gu_id=0, holds=None, full_requests=1)
                    continue
                done = flow.gu.convert(version, str(path))
                assert done.path is not None
                _assert_exact(_loaded(done.path), full, version)
                if version == corrupt_at + 1:
                    # The ask is the GU's: every rank answers it once with a full refresh.
                    assert all(unpack((path / delta_file(r)).read_bytes()).is_full for r in (0, 1))
                if version == corrupt_at + 2:
                    assert not any(unpack((path / delta_file(r)).read_bytes()).is_full for r in (0, 1))
        totals = flow.gu.delta_stats()
    finally:
        flow.close()
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 1 and f"v{corrupt_at}" in errors[0] and f"tensor {tensor}" in errors[0]
    assert "asking the trainer for a full snapshot" in errors[0]
    assert totals["delta_resends"] == 1
    (report,) = read_reports(flow.root)
    assert report.holds == 8 and report.full_requests == 1


def test_a_gu_that_skipped_versions_catches_up_along_the_published_chain(tmp_path: Path) -> None:
    trainer = codec.Trainer(codec._dense, tied=False)
    flow = Path_(tmp_path, codec.TP1, DeltaSettings(mode="on", full_interval=100), keep=4)
    try:
        for version in range(1, 5):
            trainer.step()
            full = trainer.export()
            path = flow.export(version, full)
            if version in (1, 4):  # v2, v3 never converted (the GU converts only the newest)
                done = flow.gu.convert(version, str(path))
                assert done.path is not None
                _assert_exact(_loaded(done.path), full, version)
        assert done.metrics is not None and done.metrics["delta_refreshes_applied"] == 3  # v2, v3, v4
        assert read_reports(flow.root) == [DeltaBaseReport(gu_id=0, holds=4, full_requests=0)]
    finally:
        flow.close()


def test_a_restarted_gu_gets_a_full_copy(tmp_path: Path) -> None:
    """A new GU holds nothing: it walks back to the newest full while that is still published,
    and once it is pruned it asks, is refused this version, and gets the next one in full."""
    from mindspeed_rl.weights.manifest import SnapshotError

    trainer = codec.Trainer(codec._dense, tied=False)
    settings = DeltaSettings(mode="on", full_interval=100)
    flow = Path_(tmp_path, codec.TP1, settings, keep=2)
    try:
        for version in range(1, 5):
            trainer.step()
            full = trainer.export()
            path = flow.export(version, full)
            flow.gu.convert(version, str(path))
        fresh = transport_for("shared_fs").gu_end(tmp_path / "gu-0", delta=settings, gu_id=0)
        with pytest.raises(SnapshotError, match="v4, rank 0: v2 is needed on the way from nothing"):
            fresh.convert(4, str(path))
        assert read_reports(flow.root)[0].full_requests == 1
        trainer.step()
        full = trainer.export()
        path = flow.export(5, full)
        assert unpack((path / delta_file(0)).read_bytes()).is_full
        done = fresh.convert(5, str(path))
        assert done.path is not None
        _assert_exact(_loaded(done.path), full, 5)
    finally:
        flow.close()


def test_a_new_trainer_resumes_with_a_full_snapshot(tmp_path: Path) -> None:
    """Resume: the TU's encoders start empty, so its first export re-establishes every base."""
    trainer = codec.Trainer(codec._dense, tied=False)
    settings = DeltaSettings(mode="on", full_interval=100)
    flow = Path_(tmp_path, codec.TP1, settings)
    for version in range(1, 4):
        trainer.step()
        flow.gu.convert(version, str(flow.export(version, trainer.export())))
    flow.close()
    resumed = transport_for("shared_fs").exporter(flow.root, 3, run_id=RUN, delta=settings)
    try:
        trainer.step()
        full = trainer.export()
        resumed.export(4, full.items(), codec.TP1, 0).result()
        path = flow.root / snapshot_dirname(4)
        assert unpack((path / delta_file(0)).read_bytes()).is_full
        done = flow.gu.convert(4, str(path))
        assert done.path is not None
        _assert_exact(_loaded(done.path), full, 4)
    finally:
        resumed.close()


def test_auto_writes_full_when_the_delta_is_not_small(tmp_path: Path) -> None:
    settings = DeltaSettings(mode="auto", full_interval=100)
    flow = Path_(tmp_path, codec.TP1, settings)
    w = {"a": torch.zeros(4096, dtype=torch.bfloat16)}
    try:
        flow.gu.convert(1, str(flow.export(1, w)))
        w["a"][:3] = 1.0
        assert not unpack((flow.export(2, w) / delta_file(0)).read_bytes()).is_full
        w["a"] += 1.0
        path = flow.export(3, w)
        assert unpack((path / delta_file(0)).read_bytes()).is_full
        # The GU was not asked to convert v2: v3 is full, so it needs no chain.
        done = flow.gu.convert(3, str(path))
        assert done.path is not None
        _assert_exact(_loaded(done.path), w, 3)
    finally:
        flow.close()


def test_a_stale_report_is_answered_once_per_rank(tmp_path: Path) -> None:
    flow = Path_(tmp_path, codec.TP1, DeltaSettings(mode="on", full_interval=100))
    w = {"a": torch.arange(8, dtype=torch.float32)}
    try:
        flow.export(1, w)
        write_report(flow.root, DeltaBaseReport(gu_id=3, holds=None, full_requests=2))
        w["a"][0] = 5
        assert unpack((flow.export(2, w) / delta_file(0)).read_bytes()).is_full
        w["a"][1] = 5
        assert not unpack((flow.export(3, w) / delta_file(0)).read_bytes()).is_full
    finally:
        flow.close()


def test_the_plan_carries_delta_to_the_gu_weight_side(tmp_path: Path) -> None:
    """From the YAML key to the GU: the plan's ``AsyncSpec.weight_delta`` reaches every GU's spec
    (``async_cluster.gu_specs``) and its weight side (``GuWeightSide``), whose conversions hand
    the control loop the refresh's figures; the TU's exporter gets the same settings."""
    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.plan.build import build_run_plan
    from mindspeed_rl.trainer.async_cluster import gu_specs
    from mindspeed_rl.workers.fault_plan import FaultPlan
    from mindspeed_rl.workers.gu_weights import GuWeightSide

    overrides = ["async_config.weight_delta=on", "async_config.delta_full_interval=5"]
    plan = build_run_plan(load_config_from_files(codec.CONFIGS, "grpo_tiny_asp", overrides))
    assert plan.async_spec is not None
    snapshots = tmp_path / "snapshots"
    specs = gu_specs(plan, str(tmp_path / "policy"), {}, snapshots, FaultPlan())
    assert {s.weight_delta for s in specs} == {DeltaSettings(mode="on", full_interval=5)}
    side = GuWeightSide(specs[0])
    exporter = transport_for(plan.async_spec.weight_transport).exporter(
        snapshots / "trainer", 2, run_id=RUN, delta=plan.async_spec.weight_delta
    )
    trainer = codec.Trainer(codec._dense, tied=True)
    try:
        for version in range(1, 4):
            trainer.step()
            full = trainer.export()
            exporter.export(version, full.items(), codec.TP1, 0).result()
            done = side.convert(version, str(snapshots / "trainer" / snapshot_dirname(version)))
            assert done.path is not None and done.delta is not None
            assert (done.delta["delta_changed_fraction"] == 1.0) == (version == 1)  # v1 full, then deltas
            _assert_exact(_loaded(done.path), full, version)
        assert side.delta_stats()["delta_refreshes"] == 3
    finally:
        exporter.close()
