"""The reference's weights on the host except during its log-prob pass (upstream's integrated
worker, ``rl_config.use_integrated_worker``), in the torch engine's and the megatron engine's
reference models.

On this CPU-only host the compute device and the host are both ``cpu``: the moves are no-ops
device-wise, so the tests check the code path through ``HostResidency``'s bookkeeping (where
the weights are meant to be, and the moves made) and that every parameter sits on the device it
names, and that log-probs are identical with offload on and off.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import mindspeed_rl.models.training.reference as reference_module
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.host_residency import HostResidency
from mindspeed_rl.models.training.reference import ReferenceModel


def _batch() -> TrainBatch:
    return TrainBatch.from_lists(
        prompt_ids=[[3, 4, 5], [6, 7], [8, 9, 10, 11]],
        response_ids=[[12, 13], [14, 15, 16], [17]],
        advantages=np.array([1.0, -1.0, 0.5]),
    )


def _devices(module: torch.nn.Module) -> set[torch.device]:
    return {t.device for t in [*module.parameters(), *module.buffers()]}


def test_torch_reference_is_on_the_host_between_passes_and_scores_the_same(
    tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = ReferenceModel(tiny_model_path, micro_batch_size=2, offload=False)
    moved = ReferenceModel(tiny_model_path, micro_batch_size=2, offload=True)
    assert kept.residency.location == "device" and kept.residency.moves == 0
    # Offloaded as soon as it is built (upstream offloads right after loading it).
    assert moved.residency.location == "host" and moved.residency.moves == 1

    seen: list[str] = []
    real = reference_module.compute_response_log_probs

    def spy(model: torch.nn.Module, *args: Any, **kwargs: Any) -> list[np.ndarray]:
        residency = moved.residency if model is moved._model else kept.residency
        assert _devices(model) == {residency.device}
        seen.append(residency.location)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(reference_module, "compute_response_log_probs", spy)
    batch = _batch()
    for _ in range(2):
        expected = kept.compute_log_probs(batch, temperature=0.7)
        got = moved.compute_log_probs(batch, temperature=0.7)
        for a, b in zip(expected, got, strict=True):
            np.testing.assert_array_equal(a, b)
    assert seen == ["device"] * 4  # both models score on the device, the offloaded one onloaded
    assert moved.residency.location == "host" and moved.residency.moves == 1 + 2 * 2
    assert _devices(moved._model) == {moved.residency.host}
    assert kept.residency.location == "device" and kept.residency.moves == 0


def test_a_failed_pass_still_puts_the_weights_back_on_the_host() -> None:
    residency = HostResidency(torch.nn.Linear(2, 2), enabled=True)
    with pytest.raises(RuntimeError, match="boom"), residency.resident():
        assert residency.location == "device"
        raise RuntimeError("boom")
    assert residency.location == "host" and residency.moves == 3


def _megatron_worker(rank: int, port: int, model_dir: str, out: Any) -> None:
    import torch.distributed as dist

    from benchmarks.parity.engine import LAYOUTS, init_gloo

    init_gloo(rank, 2, port)
    try:
        from mindspeed_rl.models.training.megatron.reference import MegatronReferenceModel

        layout = LAYOUTS["pp2"]  # a stage per rank: each offloads its own shard
        kept = MegatronReferenceModel(model_dir, layout, micro_batch_size=1, offload=False)
        moved = MegatronReferenceModel(model_dir, layout, micro_batch_size=1, offload=True)
        assert moved.residency.location == "host"
        batch = _batch()
        expected = kept.compute_log_probs(batch, temperature=0.7)
        got = moved.compute_log_probs(batch, temperature=0.7)
        same = all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
        on_host = _devices(moved.model) == {moved.residency.host}
        out.put((rank, same, len(got), moved.residency.location, moved.residency.moves, on_host))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
def test_megatron_reference_offload_keeps_log_probs(tmp_path: Path) -> None:
    from benchmarks.parity import ranks
    from benchmarks.parity.engine import free_port
    from benchmarks.parity.models import build_parity_model

    model_dir = build_parity_model(tmp_path / "qwen2", "qwen2", tied=True)
    out = ranks.context().SimpleQueue()
    ranks.start_ranks(_megatron_worker, (free_port(), str(model_dir), out), 2)
    results = []
    while not out.empty():
        results.append(out.get())
    assert sorted(r[0] for r in results) == [0, 1]
    for rank, same, count, location, moves, on_host in results:
        assert same and count == 3, rank
        assert location == "host" and moves == 3 and on_host, rank


@pytest.mark.parametrize(
    ("config", "overrides", "offloaded"),
    [
        ("grpo_tiny_cpu", (), True),  # pipeline: hybrid, use_integrated_worker: true (its default)
        ("grpo_tiny_cpu", ("rl_config.use_integrated_worker=false",), False),
        ("grpo_tiny_asp", ("rl_config.init_kl_coef=0.001",), False),  # async: the trainer's own devices
    ],
)
def test_the_plan_and_the_training_units_reference_follow_use_integrated_worker(
    tiny_model_path: Path, config: str, overrides: tuple[str, ...], offloaded: bool
) -> None:
    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.plan.build import build_run_plan
    from mindspeed_rl.workers.training_unit import torch_engines

    configs = Path(__file__).resolve().parents[4] / "configs"
    spec = build_run_plan(load_config_from_files(configs, config, list(overrides))).trainer
    assert spec.reference_micro_batch_size is not None and spec.offload_reference is offloaded
    reference = torch_engines(spec, str(tiny_model_path)).reference
    assert reference is not None and reference.residency.enabled is offloaded
    assert reference.residency.location == ("host" if offloaded else "device")
