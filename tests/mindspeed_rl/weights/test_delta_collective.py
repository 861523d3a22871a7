"""Delta sync through the real ``collective`` weight path (``weights.delta_collective``) over a real
gloo process group per GU (the TU ranks' senders and the GU's receiver on threads of this
process; the same code runs across processes and nodes), on a local Ray instance for the object
store the GU puts its copy into: the TU's exporters (``transport_for("collective").exporter(...,
delta=...)``), the GU's end (its receiver applies the deltas, answers with the version it holds,
and puts the copy), then what an actor's engine is handed (the real memory reader: fetch +
convert, TP/EP merges included), bit for bit against the trainer's weights at every version."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import delta_cases as cases
import pytest
import test_weight_delta as codec  # the codec's tests: their trainer, models and layouts
import torch

import mindspeed_rl.weights.delta_collective as delta_collective
from mindspeed_rl.weights.delta import DeltaRefresh
from mindspeed_rl.weights.layout import TrainingLayout
from mindspeed_rl.weights.manifest import SnapshotError
from mindspeed_rl.weights.memory_snapshot import MemorySnapshot
from mindspeed_rl.weights.transport import memory_path
from mindspeed_rl.weights.transports import DeltaSettings, transport_for
from mindspeed_rl.weights.transports.base import Converted, memory_reader
from tests.support.ray_cluster import init_in_process

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ray_local():
    import ray

    init_in_process(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


class Flow:
    """One TU (a sender per rank, one run id) and ``gus`` GUs, each with its own gloo group."""

    def __init__(
        self,
        run: str,
        layout: TrainingLayout,
        settings: DeltaSettings,
        *,
        gus: int = 1,
        bucket_mb: float = 0.002,
    ) -> None:
        transport = transport_for("collective")
        self.layout = layout
        self.ends = [transport.gu_end(Path("/nonexistent"), delta=settings, gu_id=g) for g in range(gus)]
        channels = [end.open_channel(g, layout.world_size + 1, "gloo") for g, end in enumerate(self.ends)]
        self.gu = self.ends[0]
        self.writers = [
            transport.exporter(
                Path("/nonexistent"), 2, run_id=run, channels=channels, bucket_mb=bucket_mb, delta=settings
            )
            for _ in range(layout.world_size)
        ]

    def export(self, version: int, full: dict[str, torch.Tensor]) -> MemorySnapshot:
        futures = [
            w.export(version, cases.rank_tensors(self.layout, full, rank).items(), self.layout, rank)
            for rank, w in enumerate(self.writers)
        ]
        handles = [f.result(timeout=120).handle for f in futures]
        (handle,) = [h for h in handles if h is not None]  # the last rank in announces it
        assert isinstance(handle, MemorySnapshot) and handle.medium == "collective"
        return handle

    def convert(self, version: int, announced: Any, gu: int = 0) -> Converted:
        return self.ends[gu].convert(version, memory_path(version))

    def loaded(self, path: str, gu: int = 0) -> dict[str, torch.Tensor]:
        weights, _ = memory_reader(self.ends[gu].reload_handle(path))()
        return {name: tensor.clone() for name, tensor in weights}

    def close(self) -> None:
        for w in self.writers:
            w.close()


@pytest.mark.parametrize(("model", "layout"), cases.CASES)
def test_twenty_versions_through_the_collective_are_bit_exact(
    ray_local: Any, model: str, layout: TrainingLayout
) -> None:
    def check(announced: MemorySnapshot, done: Converted) -> None:
        # The receiver put the applied copies as a training snapshot (actors convert on load).
        got = flow.gu.reload_handle(str(done.path))
        assert got.kind == "training" and len(got.shards) == layout.world_size

    flow = Flow(f"coll-{model}-{layout.world_size}", layout, cases.EVERY_8)
    try:
        cases.run_twenty_versions(flow, model, check)
        # The packed refreshes (their words plus the pack's metadata) are what crossed the group.
        for w in flow.writers:
            stats = w.stats()
            assert stats["collective_groups_created"] == 1.0, "one group per GU, reused"
            assert stats["collective_bytes_sent"] >= stats["delta_bytes_sent"] > 0
    finally:
        flow.close()


def _corrupt_first(version: int, tensor: str) -> Any:
    """``pack`` that flips one bit of one carried word of ``tensor`` in the first delta of
    ``version`` it packs (one rank's), after the encoder computed its checksum: what a wire or
    memory fault would do."""
    real = delta_collective.pack
    done = threading.Event()
    lock = threading.Lock()

    def pack(refresh: DeltaRefresh) -> bytes:
        with lock:
            if refresh.version != version or refresh.is_full or done.is_set():
                return real(refresh)
            done.set()
        part = next(p for p in refresh.tensors if p.name == tensor)
        data = part.data.copy()
        data[0] ^= 1
        bad = DeltaRefresh(
            version=refresh.version, base_version=refresh.base_version,
            tensors=tuple(type(p)(**{**{f: getattr(p, f) for f in p.__slots__}, "data": data}) if p is part else p
                          for p in refresh.tensors),
            full_nbytes=refresh.full_nbytes, changed_elements=refresh.changed_elements,
            total_elements=refresh.total_elements, encode_seconds=refresh.encode_seconds,
        )  # fmt: skip
        return real(bad)

    return pack


def test_a_corrupted_delta_is_named_then_recovered_by_a_full_resend(
    ray_local: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    corrupt_at, tensor = 5, "model.layers.0.mlp.gate_proj.weight"
    monkeypatch.setattr(delta_collective, "pack", _corrupt_first(corrupt_at, tensor))
    trainer = codec.Trainer(codec._dense, tied=False)
    flow = Flow("coll-corrupt", codec.TP2, DeltaSettings(mode="on", full_interval=100))
    try:
        with caplog.at_level(logging.ERROR, logger="mindspeed_rl.weights.delta_collective"):
            for version in range(1, 9):
                trainer.step()
                full = trainer.export()
                flow.export(version, full)
                if version == corrupt_at:
                    with pytest.raises(
                        SnapshotError, match=rf"v{corrupt_at}: tensor {tensor} does not match"
                    ):
                        flow.convert(version, None)
                    continue
                done = flow.convert(version, None)
                assert done.path is not None and done.metrics is not None
                cases.assert_exact(flow.loaded(done.path), full, version)
                if version == corrupt_at + 1:  # the rank whose copy was dropped sent it full
                    assert 0.5 < done.metrics["delta_changed_fraction"] < 1.0
        totals = flow.gu.delta_stats()
        fulls = sorted(w.stats()["delta_full_refreshes"] for w in flow.writers)
    finally:
        flow.close()
    # This module's records only: an earlier test's receiver thread may log its channel closing.
    errors = [r.getMessage() for r in caplog.records if r.name == delta_collective.__name__]
    assert len(errors) == 1 and f"v{corrupt_at}" in errors[0] and f"tensor {tensor}" in errors[0]
    assert "asking the trainer for a full snapshot" in errors[0]
    assert totals["delta_resends"] == 1
    assert fulls == [1.0, 2.0], "v1 on both ranks, v6 again only on the rank whose delta was corrupt"


def test_a_gu_that_lost_its_copy_gets_the_version_in_full_while_another_takes_the_delta(
    ray_local: Any,
) -> None:
    """Two GUs on one rank; GU 1 loses its copy after answering v2. v3 (a delta on v2) is then
    refused there, naming the missing base, and it answers "nothing": the rank encodes v4 once as
    a delta for GU 0 and sends the same version in full to GU 1."""
    trainer = codec.Trainer(codec._dense, tied=False)
    flow = Flow("coll-two-gus", codec.TP1, DeltaSettings(mode="on", full_interval=100), gus=2)
    try:
        for version in range(1, 5):
            trainer.step()
            full = trainer.export()
            flow.export(version, full)
            for gu in (0, 1):
                if (version, gu) == (3, 1):
                    with pytest.raises(SnapshotError, match="a delta on v2, but this receiver holds nothing"):
                        flow.convert(version, None, gu)
                    continue
                done = flow.convert(version, None, gu)
                assert done.path is not None and done.metrics is not None
                cases.assert_exact(flow.loaded(done.path, gu), full, version)
                if version == 4:
                    assert (done.metrics["delta_changed_fraction"] == 1.0) == (gu == 1)
            if version == 2:
                flow.ends[1].receiver.delta.receivers[0].reset()  # its copy is gone
        (stats,) = [w.stats() for w in flow.writers]
        lost = flow.ends[1].delta_stats()
    finally:
        flow.close()
    assert stats["delta_full_refreshes"] == 2 and stats["delta_resends"] == 1  # v1; v4 to GU 1 only
    assert lost["delta_resends"] == 1
