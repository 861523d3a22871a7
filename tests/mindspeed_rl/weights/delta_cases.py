"""What every transport's delta test shares: the models and layouts (the codec's, from
``test_weight_delta``), the 20-version run, and the bit-for-bit comparison. A transport's test
supplies a flow: ``export`` (every rank's exporter, as rank processes do) returning what the TU
announces, ``convert`` (the GU's end), ``loaded`` (what an actor's engine is handed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol
from unittest import mock

import pytest
import test_weight_delta as codec  # the codec's tests: their trainer, models and layouts
import torch

from mindspeed_rl.weights import export
from mindspeed_rl.weights.layout import TrainingLayout
from mindspeed_rl.weights.transports import DeltaSettings
from mindspeed_rl.weights.transports.base import Converted

VERSIONS = 20
EVERY_8 = DeltaSettings(mode="on", full_interval=8)
"""Full at 1, 9, 17 over 20 versions; the rest deltas."""

CASES = [
    pytest.param("dense", codec.TP1, id="dense-identity"),
    pytest.param("dense", codec.TP2, id="dense-tp2_to_tp1"),
    pytest.param("tied", codec.TP1, id="tied-identity"),
    pytest.param("tied", codec.TP2, id="tied-tp2_to_tp1"),
    pytest.param("moe", codec.MOE_LAYOUT, id="moe-ep2tp2_to_1"),
]
"""(model, training layout) of every transport's 20-version test; the GU converts to TP1."""


class Flow(Protocol):
    layout: TrainingLayout
    gu: Any
    writers: list[Any]

    def export(self, version: int, full: dict[str, torch.Tensor]) -> Any: ...

    def convert(self, version: int, announced: Any) -> Converted: ...

    def loaded(self, path: str) -> dict[str, torch.Tensor]: ...


def trainer_for(model: str) -> codec.Trainer:
    return codec.Trainer(codec._moe if model == "moe" else codec._dense, tied=model == "tied")


def rank_tensors(layout: TrainingLayout, full: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    return codec._rank_tensors(layout, full, rank)


def assert_exact(got: dict[str, torch.Tensor], full: dict[str, torch.Tensor], version: int) -> None:
    assert sorted(got) == sorted(full), version
    for name, tensor in full.items():
        assert got[name].dtype == tensor.dtype and torch.equal(codec._bits(got[name]), codec._bits(tensor)), (
            version,
            name,
        )


def run_twenty_versions(
    flow: Flow, model: str, check: Callable[[Any, Converted], None] | None = None
) -> None:
    """Twenty trainer steps through ``flow`` (made with ``EVERY_8``), each version's weights as an
    actor gets them compared bit for bit; then the TU's and the GU's totals. ``check(announced,
    converted)``: what the transport's own medium carried, per version."""
    trainer = trainer_for(model)
    sent = 0
    reused: list[bool] = []  # per export copy: went into the encoder's spare base (take_spare)
    real_copy = export.copy_tensors

    def copy_tensors(tensors: Any, *, num_threads: Any = None, into: Any = None) -> Any:
        reused.append(into is not None and all(t is not None for t in into))
        return real_copy(tensors, num_threads=num_threads, into=into)

    for version in range(1, VERSIONS + 1):
        trainer.step()
        full = trainer.export()
        with mock.patch.object(export, "copy_tensors", copy_tensors):
            announced = flow.export(version, full)
        done = flow.convert(version, announced)
        assert done.path is not None and done.metrics is not None
        sent += int(done.metrics["delta_bytes_sent"])
        if check is not None:
            check(announced, done)
        got = flow.loaded(done.path)
        assert_exact(got, full, version)
        if model == "tied":
            assert torch.equal(got["lm_head.weight"], got["model.embed_tokens.weight"])
    for totals in [w.stats() for w in flow.writers]:  # full at 1, 9, 17 on each rank
        assert totals["delta_refreshes"] == VERSIONS and totals["delta_full_refreshes"] == 3
        assert 0 < totals["delta_bytes_fraction"] < 1
    # v1 is copied into fresh memory, so is v2 (v1's copy is the base); from v3 on each copy goes
    # into the base the encoder let go, and every version above stayed exact.
    world = flow.layout.world_size
    assert len(reused) == VERSIONS * world and all(reused[2 * world :]) and not any(reused[:world])
    gu_totals = flow.gu.delta_stats()
    assert gu_totals["delta_refreshes"] == VERSIONS * flow.layout.world_size
    assert gu_totals["delta_resends"] == 0 and gu_totals["delta_bytes_sent"] == sent
