"""The Training Unit worker group on a local Ray cluster: collectives over gloo, dead ranks named,
and the megatron engine at TP2 across two rank actors."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mindspeed_rl.workers.training_group import GroupSpec, TrainingGroup, TrainingRankError
from tests.support.ray_cluster import init_in_process

pytestmark = pytest.mark.integration


class _Probe:
    """A rank target using the process group the worker set up."""

    def rank_sum(self) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return float(t.item())

    def die_on(self, rank: int) -> None:
        import torch.distributed as dist

        if dist.get_rank() == rank:
            os._exit(1)
        dist.barrier()  # the survivor would wait here forever without the group's failure check


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    init_in_process(num_cpus=2, include_dashboard=False)
    # Test-module classes are not importable in Ray workers: ship them by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


@pytest.mark.timeout(180)
def test_every_rank_runs_the_call_and_collectives_work(ray_local: None) -> None:
    group = TrainingGroup(GroupSpec(world_size=2, num_cpus_per_rank=0.5), _Probe)
    try:
        assert group.call("rank_sum") == 3.0
        assert group.call_all("rank_sum") == [3.0, 3.0]
        assert len(set(group.rank_pids())) == 2
    finally:
        group.shutdown()


@pytest.mark.timeout(180)
def test_a_dead_rank_is_named_not_a_hang(ray_local: None) -> None:
    group = TrainingGroup(GroupSpec(world_size=2, num_cpus_per_rank=0.5), _Probe)
    # A hang instead of the error would run into the timeout mark above: no wall-clock bound here.
    with pytest.raises(TrainingRankError, match="rank 1 of 2 died"):
        group.call("die_on", 1)


@pytest.mark.timeout(180)
def test_a_raising_rank_is_named_with_its_error(ray_local: None) -> None:
    group = TrainingGroup(GroupSpec(world_size=2, num_cpus_per_rank=0.5), _Probe)
    with pytest.raises(TrainingRankError, match=r"rank 0 of 2 failed.*has no attribute 'no_such_method'"):
        group.call("no_such_method")


def test_rank_options_must_match_the_world_size() -> None:
    with pytest.raises(ValueError, match="1 rank_options for 2 ranks"):
        GroupSpec(world_size=2, rank_options=({"num_cpus": 1},))


@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
def test_megatron_engine_at_tp2_through_the_group(ray_local: None, tmp_path: Path) -> None:
    from benchmarks.parity.engine import parity_batch, parity_engine_config
    from benchmarks.parity.models import build_parity_model
    from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
    from mindspeed_rl.models.training.megatron.layout import MegatronLayout
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

    model = build_parity_model(tmp_path / "qwen3", "qwen3")
    batch = parity_batch(100)
    config = parity_engine_config(num_samples=batch.num_samples)
    factory = functools.partial(
        MegatronTrainingEngine, str(model), config, MegatronLayout(tensor_model_parallel_size=2)
    )
    group = TrainingGroup(GroupSpec(world_size=2, num_cpus_per_rank=0.5), factory)
    try:
        got = group.call("compute_log_probs", batch, 0.7)
    finally:
        group.shutdown()
    want = TorchTrainingEngine(model, config).compute_log_probs(batch, temperature=0.7)
    assert max(float(np.abs(a - b).max()) for a, b in zip(got, want)) <= 1e-4
