"""Delta sync through the real ``object_store`` weight path (``weights.delta_object_store``), on a
local Ray instance: the TU's exporter (``transport_for("object_store").exporter(..., delta=...)``,
one per training rank sharing the run id, as rank processes do), the GU's end (apply to the host
copy, put it as the training snapshot actors fetch), then what an actor's engine is handed (the
real memory reader: fetch + convert, TP/EP merges included), bit for bit against the trainer's
weights at every version."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import delta_cases as cases
import numpy as np
import pytest
import test_weight_delta as codec  # the codec's tests: their trainer, models and layouts
import torch

from mindspeed_rl.weights.delta_object_store import DeltaSnapshot, board_name
from mindspeed_rl.weights.delta_wire import pack, unpack
from mindspeed_rl.weights.layout import TrainingLayout
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
    """One TU (an exporter per rank, one run id) and one GU on the object store."""

    def __init__(self, run: str, layout: TrainingLayout, settings: DeltaSettings) -> None:
        transport = transport_for("object_store")
        self.layout = layout
        self.writers = [
            transport.exporter(Path("/nonexistent"), 2, run_id=run, delta=settings)
            for _ in range(layout.world_size)
        ]
        self.gu = transport.gu_end(Path("/nonexistent"), delta=settings, gu_id=0)

    def export(self, version: int, full: dict[str, torch.Tensor]) -> DeltaSnapshot:
        futures = [
            w.export(version, cases.rank_tensors(self.layout, full, rank).items(), self.layout, rank)
            for rank, w in enumerate(self.writers)
        ]
        handles = [f.result().handle for f in futures]
        (handle,) = [h for h in handles if h is not None]  # the last rank in announces it
        assert isinstance(handle, DeltaSnapshot)
        return handle

    def convert(self, version: int, announced: DeltaSnapshot) -> Converted:
        return self.gu.convert(version, f"memory://v{version}", announced)

    def loaded(self, path: str) -> dict[str, torch.Tensor]:
        weights, _ = memory_reader(self.gu.reload_handle(path))()
        return {name: tensor.clone() for name, tensor in weights}

    def close(self) -> None:
        for w in self.writers:
            w.close()


_assert_exact = cases.assert_exact


@pytest.mark.parametrize(("model", "layout"), cases.CASES)
def test_twenty_versions_through_the_object_store_are_bit_exact(
    ray_local: Any, model: str, layout: TrainingLayout
) -> None:
    def check(handle: DeltaSnapshot, done: Converted) -> None:
        # What the TU put is the packed refreshes: this version's link of every rank.
        assert handle.nbytes == sum(s.chain[-1].nbytes for s in handle.shards) > 0

    flow = Flow(f"os-{model}-{layout.world_size}", layout, cases.EVERY_8)
    try:
        cases.run_twenty_versions(flow, model, check)
    finally:
        flow.close()


def test_a_corrupted_delta_object_is_named_then_recovered_by_a_full_resend(
    ray_local: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from mindspeed_rl.weights.manifest import SnapshotError

    ray = ray_local
    trainer = codec.Trainer(codec._dense, tied=False)
    flow = Flow("os-corrupt", codec.TP2, DeltaSettings(mode="on", full_interval=100))
    corrupt_at, tensor = 5, "model.layers.0.mlp.gate_proj.weight"
    try:
        with caplog.at_level(logging.ERROR, logger="mindspeed_rl.weights.delta_object_store"):
            for version in range(1, 9):
                trainer.step()
                full = trainer.export()
                handle = flow.export(version, full)
                if version == corrupt_at:  # one bit of one carried word of rank 1's delta object
                    shard = handle.shards[1]
                    link = shard.chain[-1]
                    refresh = unpack(np.asarray(ray.get(link.ref)).tobytes())
                    assert not refresh.is_full
                    part = next(p for p in refresh.tensors if p.name == tensor)
                    data = part.data.copy()
                    data[0] ^= 1
                    object.__setattr__(part, "data", data)
                    bad = replace(link, ref=ray.put(np.frombuffer(pack(refresh), dtype=np.uint8)))
                    handle = replace(
                        handle,
                        shards=(handle.shards[0], replace(shard, chain=(*shard.chain[:-1], bad))),
                    )
                    with pytest.raises(
                        SnapshotError, match=rf"v{corrupt_at}: tensor {tensor} does not match"
                    ):
                        flow.gu.convert(version, f"memory://v{version}", handle)
                    asks = ray.get(ray.get_actor(board_name("os-corrupt")).full_requests.remote())
                    assert asks == {0: 1}
                    continue
                done = flow.gu.convert(version, f"memory://v{version}", handle)
                assert done.path is not None
                _assert_exact(flow.loaded(done.path), full, version)
                links = [s.chain[-1] for s in handle.shards]
                if version == corrupt_at + 1:  # the ask is answered once by every rank: full
                    assert all(link.base_version is None for link in links)
                    assert all(len(s.chain) == 1 for s in handle.shards)
                if version == corrupt_at + 2:
                    assert all(link.base_version == corrupt_at + 1 for link in links)
        totals = flow.gu.delta_stats()
    finally:
        flow.close()
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 1 and f"v{corrupt_at}" in errors[0] and f"tensor {tensor}" in errors[0]
    assert "asking the trainer for a full snapshot" in errors[0]
    assert totals["delta_resends"] == 1


def test_a_gu_that_skipped_versions_or_restarted_walks_the_handles_chain(ray_local: Any) -> None:
    trainer = codec.Trainer(codec._dense, tied=False)
    settings = DeltaSettings(mode="on", full_interval=100)
    flow = Flow("os-skip", codec.TP1, settings)
    try:
        for version in range(1, 5):
            trainer.step()
            full = trainer.export()
            handle = flow.export(version, full)
            if version in (1, 4):  # v2, v3 never converted (the GU converts only the newest)
                done = flow.gu.convert(version, f"memory://v{version}", handle)
                _assert_exact(flow.loaded(str(done.path)), full, version)
        assert done.metrics is not None and done.metrics["delta_refreshes_applied"] == 3  # v2, v3, v4
        fresh = transport_for("object_store").gu_end(Path("/nonexistent"), delta=settings, gu_id=1)
        again = fresh.convert(4, "memory://v4", handle)  # holds nothing: from the chain's full, v1
        assert again.metrics is not None and again.metrics["delta_refreshes_applied"] == 4
        weights, _ = memory_reader(fresh.reload_handle(str(again.path)))()
        _assert_exact({n: t.clone() for n, t in weights}, full, 4)
    finally:
        flow.close()
