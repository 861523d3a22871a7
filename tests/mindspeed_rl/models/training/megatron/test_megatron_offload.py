"""The colocated hybrid's offload on megatron's DDP (gloo ranks, a real engine): the contiguous
gradient buffer every ``main_grad`` views is freed, and under the distributed optimizer the
parameter buffer every parameter views goes to host and back, the views staying views.

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
    import torch.multiprocessing as mp

    from benchmarks.parity.engine import free_port
    from benchmarks.parity.models import build_parity_model

    root = tmp_path_factory.mktemp("offload")
    family, ep = request.param
    model_dir = build_parity_model(root / "model", family)
    out = root / "report.pt"
    args = (ep, ep, free_port(), str(model_dir), str(out))
    mp.start_processes(_worker, args=args, nprocs=ep, start_method="spawn")
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
    assert report["dist_params_still_views"]


def test_a_plain_module_has_no_megatron_buffers() -> None:
    from mindspeed_rl.workers.colocation import grad_buffers

    assert grad_buffers(torch.nn.Linear(2, 2)) == []
