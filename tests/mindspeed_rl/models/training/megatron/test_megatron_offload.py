"""The colocated hybrid's offload on megatron's DDP (gloo ranks, a real engine): the contiguous
gradient buffer every ``main_grad`` views is freed, and under the distributed optimizer the
parameter buffer every parameter views goes to host and back, the views staying views. Then the
same cycle on the optimizer an accelerator run gets: ``get_megatron_optimizer``'s
``ChainedOptimizer`` (issue 39, defect 1), built and stepped here through
``tests/support/megatron_on_cpu.py``.

Offloading moves nothing between devices on this host (the "device" is the CPU), so the tests
check what an accelerator run depends on: the storage really is freed, every view survives,
the values come back bit-exact, and an update after a full offload cycle equals one without.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest
import torch

HAVE_MEGATRON = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)
pytestmark = [
    pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core not installed (make setup installs it)"),
    pytest.mark.timeout(300),
    pytest.mark.integration,  # a spawned gloo rank
]
ALL_PARTS = ("param", "grad", "optimizer")


def _config() -> Any:
    from mindspeed_rl.models.loss.config import GRPOLossConfig
    from mindspeed_rl.models.training.engine_config import TorchEngineConfig

    return TorchEngineConfig(
        lr=1e-3, micro_batch_size=2, mini_batch_size=4, n_samples_per_prompt=1,
        loss=GRPOLossConfig(init_kl_coef=0.0),
    )  # fmt: skip


def _batch(vocab_size: int, seed: int) -> Any:
    from mindspeed_rl.models.training.batch import TrainBatch

    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, vocab_size, size=int(rng.integers(3, 9))) for _ in range(4)]
    responses = [rng.integers(1, vocab_size, size=int(rng.integers(2, 10))) for _ in range(4)]
    return TrainBatch.from_lists(
        prompt_ids=prompts, response_ids=responses, advantages=np.array([1.0, -1.0, 0.5, -0.5], np.float32)
    )


def _weights(engine: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.model.module.named_parameters()}


def _worker(rank: int, world: int, ep: int, port: int, model_dir: str, out: str) -> None:
    import torch.distributed as dist
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from benchmarks.parity.engine import init_gloo
    from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
    from mindspeed_rl.models.training.megatron.layout import MegatronLayout
    from mindspeed_rl.workers.colocation import grad_buffers, offload_train_state, onload_train_state

    init_gloo(rank, world, port)
    layout = MegatronLayout(expert_model_parallel_size=ep)
    report: dict[str, Any] = {}
    try:
        # 1. The engine as the colocated worker drives it: step, offload everything, onload, step.
        plain = MegatronTrainingEngine(model_dir, _config(), layout)
        cycled = MegatronTrainingEngine(model_dir, _config(), layout)
        first, second = _batch(plain.dims.vocab_size, 0), _batch(plain.dims.vocab_size, 1)
        for engine in (plain, cycled):
            engine.update(first, 1.0)
        buffers = grad_buffers(cycled.model)
        main_grads = [p.main_grad for p in cycled.model.module.parameters() if p.requires_grad]
        report["num_buffers"] = len(buffers)
        report["num_expert_buffers"] = len(cycled.model.expert_parallel_buffers)
        report["grad_bytes_before"] = sum(b.grad_data.untyped_storage().nbytes() for b in buffers)
        offload_train_state(cycled.model, cycled.optimizer, ALL_PARTS)
        report["grad_bytes_offloaded"] = sum(b.grad_data.untyped_storage().nbytes() for b in buffers)
        report["main_grad_bytes_offloaded"] = sum(g.untyped_storage().nbytes() for g in main_grads)
        onload_train_state(cycled.model, cycled.optimizer, ALL_PARTS, "cpu")
        after = [p.main_grad for p in cycled.model.module.parameters() if p.requires_grad]
        report["main_grads_same_objects"] = all(a is b for a, b in zip(after, main_grads, strict=True))
        report["main_grads_zero"] = all(not g.any() for g in after)
        for engine in (plain, cycled):
            engine.update(second, 1.0)
        report["plain"], report["cycled"] = _weights(plain), _weights(cycled)

        # 2. The distributed optimizer's layout: every parameter is a view into param_data.
        from mindspeed_rl.models.training.megatron.reference import load_model_in_dtype

        module = load_model_in_dtype(model_dir, plain.dims, layout, "float32")
        ddp = DistributedDataParallel(
            config=module.config,
            ddp_config=DistributedDataParallelConfig(
                use_distributed_optimizer=True, overlap_grad_reduce=False
            ),
            module=module,
        )
        dist_buffers = grad_buffers(ddp)
        params = [p for p in ddp.module.parameters() if p.requires_grad]
        before = {id(p): p.detach().clone() for p in params}
        optimizer = torch.optim.AdamW(params, lr=1e-3)
        offload_train_state(ddp, optimizer, ("param", "grad"))
        report["dist_param_bytes_offloaded"] = sum(p.untyped_storage().nbytes() for p in params)
        report["dist_buffer_bytes_offloaded"] = sum(
            b.param_data.untyped_storage().nbytes() + b.grad_data.untyped_storage().nbytes()
            for b in dist_buffers
        )
        onload_train_state(ddp, optimizer, ("param", "grad"), "cpu")
        report["dist_params_restored"] = all(torch.equal(p, before[id(p)]) for p in params)
        # Both buffers were freed at once: the gradient buffer must come back too.
        report["dist_grads_restored"] = all(
            b.grad_data.untyped_storage().nbytes() == b.grad_data.numel() * b.grad_data.element_size()
            and not b.grad_data.any()
            for b in dist_buffers
        )
        bases = {b.param_data.untyped_storage().data_ptr() for b in dist_buffers}
        report["dist_params_still_views"] = all(p.untyped_storage().data_ptr() in bases for p in params)
        if rank == 0:
            torch.save(report, out)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=[("qwen2", 1), ("qwen3_moe", 2)], ids=["dense", "moe-ep2"])
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Dense (QKV bias) on one rank; MoE at EP2 on two, where the experts live in megatron's
    separate expert-parallel buffers."""
    from benchmarks.parity import ranks
    from benchmarks.parity.engine import free_port
    from benchmarks.parity.models import build_parity_model

    root = tmp_path_factory.mktemp("offload")
    family, ep = request.param
    model_dir = build_parity_model(root / "model", family)
    out = root / "report.pt"
    args = (ep, ep, free_port(), str(model_dir), str(out))
    ranks.start_ranks(_worker, args, ep)
    return {**torch.load(out, weights_only=False), "model": family}


def test_the_gradient_buffer_is_freed_and_comes_back_zeroed_under_the_same_views(
    report: dict[str, Any],
) -> None:
    assert report["num_buffers"] >= 1 and report["grad_bytes_before"] > 0
    assert report["model"] != "qwen3_moe" or report["num_expert_buffers"] >= 1
    assert report["grad_bytes_offloaded"] == 0 and report["main_grad_bytes_offloaded"] == 0
    assert report["main_grads_same_objects"] and report["main_grads_zero"]


def test_an_update_after_a_full_offload_cycle_equals_one_without(report: dict[str, Any]) -> None:
    plain, cycled = report["plain"], report["cycled"]
    assert plain.keys() == cycled.keys()
    for name in plain:
        torch.testing.assert_close(cycled[name], plain[name], rtol=0, atol=0, msg=name)


def test_distributed_optimizer_parameters_leave_as_one_buffer_and_return_as_views(
    report: dict[str, Any],
) -> None:
    assert report["dist_param_bytes_offloaded"] == 0 and report["dist_buffer_bytes_offloaded"] == 0
    assert report["dist_params_restored"], report
    assert report["dist_grads_restored"]
    assert report["dist_params_still_views"]


def test_a_plain_module_has_no_megatron_buffers() -> None:
    from mindspeed_rl.workers.colocation import grad_buffers

    assert grad_buffers(torch.nn.Linear(2, 2)) == []


# The optimizer get_megatron_optimizer chains for each precision (megatron-core 0.12.1 and 0.19.2).
MEGATRON_CASES = {
    "fp32": ("float32", False, "FP32Optimizer"),
    "bf16": ("bfloat16", False, "Float16OptimizerWithFloat16Params"),
    "bf16-distributed": ("bfloat16", True, "DistributedOptimizer"),
}


def _chain_state(optimizer: Any) -> list[torch.Tensor]:
    """Every tensor of every chained torch optimizer: its parameters (fp32 masters or shards) and
    their state, in a fixed order."""
    out: list[torch.Tensor] = []
    for member in optimizer.chained_optimizers:
        inner = member.optimizer
        for group in inner.param_groups:
            for p in group["params"]:
                out.append(p.detach())
                out += [v for _, v in sorted(inner.state[p].items()) if isinstance(v, torch.Tensor)]
    return out


def _megatron_worker(rank: int, world: int, port: int, model_dir: str, case: str, out: str) -> None:
    import dataclasses

    import torch.distributed as dist

    from benchmarks.parity.engine import init_gloo
    from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
    from mindspeed_rl.models.training.megatron.layout import MegatronLayout
    from mindspeed_rl.workers.colocation import (
        grad_buffers,
        offload_train_state,
        onload_train_state,
        train_state_tensors,
    )
    from tests.support.megatron_on_cpu import megatron_optimizers_on_cpu

    init_gloo(rank, world, port)
    dtype, distributed, _ = MEGATRON_CASES[case]
    config = dataclasses.replace(_config(), param_dtype=dtype, use_distributed_optimizer=distributed)
    report: dict[str, Any] = {}
    try:
        with megatron_optimizers_on_cpu():
            plain = MegatronTrainingEngine(model_dir, config, MegatronLayout())
            cycled = MegatronTrainingEngine(model_dir, config, MegatronLayout())
            first, second = _batch(plain.dims.vocab_size, 0), _batch(plain.dims.vocab_size, 1)
            for engine in (plain, cycled):
                engine.update(first, 1.0)
            optimizer = cycled.optimizer
            report["optimizer"] = type(optimizer).__name__
            report["chain"] = [type(m).__name__ for m in optimizer.chained_optimizers]
            before = [t.clone() for t in _chain_state(optimizer)]
            report["num_state"] = len(before)
            report["moved_optimizer_tensors"] = len(
                train_state_tensors(cycled.model, optimizer, ("optimizer",))
            )
            buffers = grad_buffers(cycled.model)
            report["has_param_buffer"] = all(b.param_data is not None for b in buffers)
            offload_train_state(cycled.model, optimizer, ALL_PARTS)
            report["buffer_bytes_offloaded"] = sum(
                b.grad_data.untyped_storage().nbytes()
                + (b.param_data.untyped_storage().nbytes() if b.param_data is not None else 0)
                for b in buffers
            )
            onload_train_state(cycled.model, optimizer, ALL_PARTS, "cpu")
            after = _chain_state(optimizer)
            report["state_bit_exact"] = len(after) == len(before) and all(
                torch.equal(a, b) for a, b in zip(after, before, strict=True)
            )
            for engine in (plain, cycled):
                engine.update(second, 1.0)
        report["plain"], report["cycled"] = _weights(plain), _weights(cycled)
        if rank == 0:
            torch.save(report, out)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=sorted(MEGATRON_CASES))
def megatron_report(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    from benchmarks.parity import ranks
    from benchmarks.parity.engine import free_port
    from benchmarks.parity.models import build_parity_model

    root = tmp_path_factory.mktemp("megatron-offload")
    model_dir = build_parity_model(root / "model", "qwen2")
    out = root / "report.pt"
    args = (1, free_port(), str(model_dir), request.param, str(out))
    ranks.start_ranks(_megatron_worker, args, 1)
    return {**torch.load(out, weights_only=False), "case": request.param}


def test_the_engine_gets_megatrons_chained_optimizer(megatron_report: dict[str, Any]) -> None:
    _, distributed, inner = MEGATRON_CASES[megatron_report["case"]]
    assert megatron_report["optimizer"] == "ChainedOptimizer"
    assert megatron_report["chain"] == [inner]
    assert megatron_report["has_param_buffer"] is distributed


def test_megatrons_optimizer_state_survives_the_offload_cycle_bit_exact(
    megatron_report: dict[str, Any],
) -> None:
    assert megatron_report["num_state"] > 0 and megatron_report["moved_optimizer_tensors"] > 0
    assert megatron_report["buffer_bytes_offloaded"] == 0  # DDP's buffers were freed meanwhile
    assert megatron_report["state_bit_exact"]


def test_a_megatron_step_after_the_offload_cycle_equals_one_without(megatron_report: dict[str, Any]) -> None:
    plain, cycled = megatron_report["plain"], megatron_report["cycled"]
    assert plain.keys() == cycled.keys()
    for name in plain:
        torch.testing.assert_close(cycled[name], plain[name], rtol=0, atol=0, msg=name)
