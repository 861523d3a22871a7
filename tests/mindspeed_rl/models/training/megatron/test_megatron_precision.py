"""The megatron engine's optimizer: fp32 master weights under bf16 on a CPU host (the torch
engine's ``precision.MasterWeightOptimizer``), and the construction of megatron's own optimizer
and DDP config for an accelerator (checked against a stand-in ``get_megatron_optimizer``).

What stays unproven here: megatron's optimizer itself (``Float16OptimizerWithFloat16Params`` /
``DistributedOptimizer``) never runs on this host, since it allocates on CUDA.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

HAVE_MEGATRON = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)
needs_megatron = pytest.mark.skipif(
    not HAVE_MEGATRON, reason="megatron-core not installed (make setup installs it)"
)

RUNS = ("float32", "bfloat16", "bf16_only")
"""fp32 weights; bf16 weights with fp32 masters; bf16 weights stepped by AdamW directly (no masters)."""
STEPS = 20
LR = 1e-5


def _config(param_dtype: str, **overrides: Any) -> Any:
    from mindspeed_rl.models.loss.config import GRPOLossConfig
    from mindspeed_rl.models.training.engine_config import TorchEngineConfig

    base = TorchEngineConfig(
        lr=LR, weight_decay=0.01, micro_batch_size=2, mini_batch_size=4, n_samples_per_prompt=1,
        loss=GRPOLossConfig(init_kl_coef=0.0), param_dtype=param_dtype,  # type: ignore[arg-type]
    )  # fmt: skip
    return dataclasses.replace(base, **overrides)


def _batch(vocab_size: int) -> Any:
    from mindspeed_rl.models.training.batch import TrainBatch

    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, vocab_size, size=int(rng.integers(3, 9))) for _ in range(4)]
    responses = [rng.integers(1, vocab_size, size=int(rng.integers(2, 10))) for _ in range(4)]
    return TrainBatch.from_lists(
        prompt_ids=prompts, response_ids=responses, advantages=np.array([1.0, -1.0, 0.5, -0.5], np.float32)
    )


def _worker(rank: int, port: int, model_dir: str, out: str) -> None:
    import torch.distributed as dist

    from benchmarks.parity.engine import init_gloo

    init_gloo(rank, 1, port)
    try:
        from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
        from mindspeed_rl.models.training.megatron.layout import MegatronLayout
        from mindspeed_rl.models.training.precision import AdamWSettings, FullPrecisionOptimizer

        results: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
        for run in RUNS:
            dtype = "float32" if run == "float32" else "bfloat16"
            engine = MegatronTrainingEngine(model_dir, _config(dtype), MegatronLayout())
            named = [(n, p) for n, p in engine.model.module.named_parameters() if p.requires_grad]
            if run == "bf16_only":  # what the engine did before it kept masters: AdamW on bf16 weights
                engine.optimizer = FullPrecisionOptimizer(
                    [p for _, p in named],
                    AdamWSettings(lr=LR, weight_decay=0.01, betas=(0.9, 0.95), eps=1e-8),
                )
            start = {n: p.detach().float().clone() for n, p in named}
            batch = _batch(engine.dims.vocab_size)
            for _ in range(STEPS):
                engine.update(batch, 1.0)
            masters = engine.optimizer.master_params
            results[run] = {
                "start": start,
                "weights": {n: p.detach().clone() for n, p in named},
                "masters": {n: m.detach().clone() for (n, _), m in zip(named, masters or [], strict=False)},
            }
        torch.save(results, out)
    finally:
        dist.destroy_process_group()


def run_precision_case(model_dir: Path) -> dict[str, Any]:
    from benchmarks.parity import ranks
    from benchmarks.parity.engine import free_port

    out = model_dir / "precision_runs.pt"
    ranks.start_ranks(_worker, (free_port(), str(model_dir), str(out)), 1)
    return torch.load(out, weights_only=True)


@pytest.mark.integration
@pytest.mark.timeout(300)
@needs_megatron
def test_bf16_training_moves_weights_through_fp32_masters(
    bf16_parity_model: Path, check_bf16_trajectories: Any
) -> None:
    """bf16 at lr 1e-5 for 20 steps on one gloo rank: the fp32 masters move the weights a bf16-only
    AdamW leaves untouched, and follow the fp32 run to within bf16 rounding."""
    results = run_precision_case(bf16_parity_model)
    check_bf16_trajectories(
        start=results["float32"]["start"],
        fp32=results["float32"]["weights"],
        masters=results["bfloat16"]["masters"],
        bf16=results["bfloat16"]["weights"],
        bf16_only=results["bf16_only"]["weights"],
        steps=STEPS,
        lr=LR,
    )


class _RecordingFactory:
    """Stands in for ``get_megatron_optimizer`` with one of the two signatures."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, list[Any], dict[str, Any]]] = []

    def record(self, config: Any, model_chunks: list[Any], **kwargs: Any) -> str:
        self.calls.append((config, model_chunks, kwargs))
        return "optimizer"


@needs_megatron
@pytest.mark.parametrize("version", ["0.19.2", "0.12.1"])
def test_megatron_optimizer_gets_the_engine_settings(version: str) -> None:
    from megatron.core.optimizer import OptimizerConfig

    from mindspeed_rl.models.training.lr_schedule import LRSchedule
    from mindspeed_rl.models.training.megatron.optimizer import build_megatron_optimizer

    factory = _RecordingFactory()
    if version == "0.19.2":

        def get_optimizer(config: Any, model_chunks: Any, config_overrides: Any = None, use_gloo_process_groups: bool = True) -> Any:  # fmt: skip
            return factory.record(config, model_chunks, config_overrides=config_overrides)
    else:

        def get_optimizer(config: Any, model_chunks: Any, no_weight_decay_cond: Any = None, scale_lr_cond: Any = None, lr_mult: float = 1.0, use_gloo_process_groups: bool = True) -> Any:  # fmt: skip
            return factory.record(config, model_chunks, no_weight_decay_cond=no_weight_decay_cond)

    schedule = LRSchedule(lr=3e-6, warmup_steps=10)
    config = _config(
        "bfloat16", lr=3e-6, lr_schedule=schedule, weight_decay=0.1, adam_beta1=0.8, adam_beta2=0.97,
        adam_eps=1e-6, clip_grad=0.5, use_distributed_optimizer=True,
    )  # fmt: skip
    model = torch.nn.Linear(2, 2)
    assert build_megatron_optimizer(config, model, get_optimizer=get_optimizer) == "optimizer"
    ((got, chunks, extra),) = factory.calls
    assert isinstance(got, OptimizerConfig) and chunks == [model]
    assert (got.optimizer, got.bf16, got.fp16, got.params_dtype) == ("adam", True, False, torch.bfloat16)
    assert got.lr == schedule.lr_at(1)  # the first step's; each step sets its own on the groups
    assert (got.weight_decay, got.adam_beta1, got.adam_beta2, got.adam_eps) == (0.1, 0.8, 0.97, 1e-6)
    assert got.clip_grad == 0.5 and got.use_distributed_optimizer is True
    if version == "0.19.2":
        assert extra == {"config_overrides": {}}  # no wd_mult 0 for biases and norms
    else:
        cond = extra["no_weight_decay_cond"]
        assert cond("decoder.final_layernorm.weight", torch.nn.Parameter(torch.ones(3))) is False
    unclipped = build_megatron_optimizer(
        _config("float32", clip_grad=0.0), model, get_optimizer=get_optimizer
    )
    assert unclipped == "optimizer"
    fp32 = factory.calls[-1][0]
    assert fp32.clip_grad == float("inf") and fp32.bf16 is False and fp32.params_dtype == torch.float32
    assert fp32.use_distributed_optimizer is False


@needs_megatron
def test_ddp_config_follows_upstream_keys() -> None:
    from megatron.core.distributed import DistributedDataParallelConfig

    from mindspeed_rl.models.training.megatron.optimizer import ddp_config_kwargs

    default = DistributedDataParallelConfig(**ddp_config_kwargs(_config("bfloat16"), megatron_optimizer=True))
    assert default.grad_reduce_in_fp32 is False  # upstream's accumulate_allreduce_grads_in_fp32 default
    assert default.use_distributed_optimizer is False
    config = _config("bfloat16", accumulate_allreduce_grads_in_fp32=True, use_distributed_optimizer=True)
    sharded = DistributedDataParallelConfig(**ddp_config_kwargs(config, megatron_optimizer=True))
    assert sharded.grad_reduce_in_fp32 is True and sharded.use_distributed_optimizer is True
    # A CPU host steps whole shards with torch's optimizer: gradients stay all-reduced.
    host = DistributedDataParallelConfig(**ddp_config_kwargs(config, megatron_optimizer=False))
    assert host.use_distributed_optimizer is False and host.grad_reduce_in_fp32 is True


class _FakeMegatronOptimizer:
    """A megatron optimizer's surface the engine steps: param groups with multipliers, step()."""

    def __init__(self, result: tuple[bool, float | None, int]) -> None:
        self.param_groups = [
            {"lr": 0.0, "lr_mult": 1.0, "wd_mult": 1.0},
            {"lr": 0.0, "lr_mult": 0.5, "wd_mult": 0.0},
        ]
        self.result = result

    def step(self) -> tuple[bool, float | None, int]:
        return self.result


def test_megatron_optimizer_step_sets_lr_and_reports_its_norm() -> None:
    from types import SimpleNamespace

    from mindspeed_rl.models.training.megatron.engine import _MegatronStep

    optimizer = _FakeMegatronOptimizer((True, 2.5, 0))
    engine = SimpleNamespace(
        megatron_optimizer=True, optimizer=optimizer, config=_config("bfloat16", weight_decay=0.1)
    )
    step = _MegatronStep(engine)  # type: ignore[arg-type]
    assert step.apply_gradients(lr=4e-6, max_norm=1.0) == 2.5
    assert [g["lr"] for g in optimizer.param_groups] == [4e-6, 2e-6]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert step.lr == 4e-6
    optimizer.result = (False, None, 0)
    with pytest.raises(ValueError, match="skipped the step"):
        step.apply_gradients(lr=4e-6, max_norm=1.0)


def test_the_reference_is_built_in_the_policys_dtype_on_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """``megatron_engines`` hands the reference the policy's dtype and device (bf16 policy: a bf16
    reference, not an fp32 copy of twice the size)."""
    from types import SimpleNamespace

    from mindspeed_rl.models.training.megatron.layout import MegatronLayout
    from mindspeed_rl.workers import megatron_engines

    built: dict[str, Any] = {}

    class Engine:
        def __init__(self, path: str, config: Any, layout: Any) -> None:
            built["policy"] = config

    class Reference:
        def __init__(self, path: str, layout: Any, **kwargs: Any) -> None:
            built["reference"] = kwargs

    monkeypatch.setattr(megatron_engines, "MegatronTrainingEngine", Engine)
    monkeypatch.setattr(megatron_engines, "MegatronReferenceModel", Reference)
    monkeypatch.setattr(megatron_engines.dist, "is_initialized", lambda: True)
    spec = SimpleNamespace(
        megatron=MegatronLayout(),
        engine=_config("bfloat16", device="cuda"),
        reference_micro_batch_size=3,
        offload_reference=False,
    )
    megatron_engines.megatron_engines(spec, "/model")  # type: ignore[arg-type]
    assert built["reference"]["param_dtype"] == "bfloat16" and built["reference"]["device"] == "cuda"
    assert built["reference"]["micro_batch_size"] == 3
