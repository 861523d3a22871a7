"""The megatron engine's optimizer: which one a run gets, how it is built, and one step of it.

On an accelerator: megatron's ``get_megatron_optimizer`` (bf16 parameters with fp32 main
parameters and fp32 Adam moments; the distributed optimizer shards them over DP when
``use_distributed_optimizer``), stepped by :func:`megatron_step`. It allocates on "cuda" and its
distributed optimizer accepts only ``torch.cuda.*Tensor`` parameters, so on a CPU host the engine
steps the torch engine's optimizers (``precision.py``: fp32 masters under bf16) on megatron DDP's
``main_grad`` instead (:func:`host_optimizer`, :func:`host_step`: grad norm over TP/PP (+ EP) ->
clip -> AdamW), clipping by the same rule as megatron's and the torch engine's.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from mindspeed_rl.models.training.device import torch_dtype
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.exact_collectives import exact_sum
from mindspeed_rl.models.training.megatron import patches
from mindspeed_rl.models.training.precision import AdamWSettings, ParamOptimizer, optimizer_for


def uses_megatron_optimizer() -> bool:
    """Megatron's optimizer on an accelerator; the torch optimizers on a CPU host (module docstring)."""
    return patches.device_kind() != "cpu"


def ddp_config_kwargs(config: TorchEngineConfig, *, megatron_optimizer: bool) -> dict[str, Any]:
    """``DistributedDataParallelConfig`` fields (present in megatron-core 0.12.1 and 0.19.2,
    distributed/distributed_data_parallel_config.py).

    ``grad_reduce_in_fp32``: upstream's ``accumulate_allreduce_grads_in_fp32`` (default off: the
    buffer has the parameters' dtype). The distributed optimizer needs DDP's reduce-scatter, so
    the two switch together; the CPU path steps whole shards and keeps the all-reduce.
    """
    return {
        "grad_reduce_in_fp32": config.accumulate_allreduce_grads_in_fp32,
        "overlap_grad_reduce": False,
        "use_distributed_optimizer": megatron_optimizer and config.use_distributed_optimizer,
    }


def megatron_optimizer_config_kwargs(config: TorchEngineConfig) -> dict[str, Any]:
    """``OptimizerConfig`` fields, each present under this name in megatron-core 0.12.1 and 0.19.2
    (optimizer/optimizer_config.py). The learning rate is set on the parameter groups every step
    (:func:`megatron_step`); ``lr`` here is only the first step's.

    ``clip_grad`` 0 (no clipping) becomes inf: megatron then still computes and returns the norm
    (``clip_coeff = max_norm / (norm + 1e-6)`` is never below 1), where 0 would skip the norm.
    """
    return {
        "optimizer": "adam",
        "lr": config.schedule.lr_at(1),
        "weight_decay": config.weight_decay,
        "adam_beta1": config.adam_beta1,
        "adam_beta2": config.adam_beta2,
        "adam_eps": config.adam_eps,
        "clip_grad": config.clip_grad if config.clip_grad > 0 else float("inf"),
        "bf16": config.param_dtype == "bfloat16",
        "fp16": False,
        "params_dtype": torch_dtype(config.param_dtype),
        "use_distributed_optimizer": config.use_distributed_optimizer,
    }


def _decays(name: str, param: torch.nn.Parameter) -> bool:
    return False  # megatron-core 0.12.1's no_weight_decay_cond: no parameter is exempt


def build_megatron_optimizer(
    config: TorchEngineConfig, model: torch.nn.Module, *, get_optimizer: Any = None
) -> Any:
    """megatron's optimizer over the DDP-wrapped ``model`` (``get_optimizer``: a stand-in for
    ``get_megatron_optimizer``, for tests).

    Every parameter decays, biases and norms included, as in the torch engine and this engine's
    CPU path (megatron's default exempts them): megatron-core 0.19.2 takes ``config_overrides={}``
    for that (None would apply its standard wd_mult 0 overrides), 0.12.1 a
    ``no_weight_decay_cond`` that exempts nothing.
    """
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    factory = get_optimizer or get_megatron_optimizer
    accepted = inspect.signature(factory).parameters
    extra: dict[str, Any] = {}
    if "config_overrides" in accepted:
        extra["config_overrides"] = {}
    elif "no_weight_decay_cond" in accepted:
        extra["no_weight_decay_cond"] = _decays
    return factory(OptimizerConfig(**megatron_optimizer_config_kwargs(config)), [model], **extra)


def host_optimizer(config: TorchEngineConfig, module: torch.nn.Module) -> ParamOptimizer:
    """The CPU path's optimizer (``precision.py``), over ``module``'s trainable parameters: fp32
    masters of bf16 ones. Rebuilt after weights are loaded, since the masters copy them."""
    return optimizer_for(
        [p for p in module.parameters() if p.requires_grad],
        AdamWSettings(
            lr=config.schedule.lr_at(1),
            weight_decay=config.weight_decay,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
        ),
    )


def host_step(
    model: Any, optimizer: ParamOptimizer, *, lr: float, max_norm: float, device: torch.device
) -> float:
    """One step of the CPU path over megatron DDP ``model``'s ``main_grad``; returns the norm."""
    params: list[Any] = optimizer.params  # each carries megatron DDP's ``main_grad``
    norm = global_grad_norm(params, device=device)
    if not np.isfinite(norm):
        raise ValueError(f"non-finite gradient norm {norm}; lower actor_config.lr or check the batch")
    # torch.nn.utils.clip_grad_norm_'s rule (megatron's too), so the engines clip identically.
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for p in model.module.parameters():
            if p.requires_grad:
                p.main_grad.mul_(coef)
    optimizer.take_grads([p.main_grad for p in params])
    optimizer.step(lr)
    return norm


def megatron_step(optimizer: Any, *, lr: float, weight_decay: float) -> float:
    """One step of megatron's optimizer at ``lr``; returns the gradient norm it computed."""
    # What megatron's OptimizerParamScheduler.step does to each group (0.12.1 and 0.19.2,
    # optimizer_param_scheduler.py): the multipliers megatron's param groups carry.
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)
        group["weight_decay"] = weight_decay * group.get("wd_mult", 1.0)
    # (success, grad_norm, num_zeros_in_grad) in 0.12.1 and 0.19.2 (optimizer/optimizer.py).
    success, grad_norm, _ = optimizer.step()
    norm = float("nan") if grad_norm is None else float(grad_norm)
    if not success or not np.isfinite(norm):
        raise ValueError(
            f"megatron's optimizer skipped the step (success={success}, gradient norm {norm}); lower "
            "actor_config.lr or check the batch"
        )
    return norm


def global_grad_norm(params: Any, *, device: torch.device | str = "cpu") -> float:
    """L2 norm of every ``main_grad`` over the whole model, each shard counted once; the partial
    sums live on ``device`` (the engine's), where the model-parallel all-reduces run."""
    from megatron.core import parallel_state as ps

    dense = torch.zeros((), dtype=torch.float64, device=device)
    expert = torch.zeros((), dtype=torch.float64, device=device)
    tp_rank = ps.get_tensor_model_parallel_rank()
    etp_rank = ps.get_expert_tensor_parallel_rank()
    for p in params:
        # ``shared``: the last PP stage's copy of tied embeddings (its grad equals the first stage's).
        if not p.requires_grad or getattr(p, "shared", False):
            continue
        split = bool(getattr(p, "tensor_model_parallel", False))
        sq = p.main_grad.double().square().sum()
        if not getattr(p, "allreduce", True):  # megatron marks expert parameters allreduce=False
            if split or etp_rank == 0:
                expert += sq
        elif split or tp_rank == 0:
            dense += sq
    # float64 sums through a gather (exact_collectives): a float64 all-reduce is refused by HCCL.
    dense = exact_sum(dense.reshape(1), ps.get_model_parallel_group())
    expert = exact_sum(expert.reshape(1), ps.get_expert_tensor_model_pipeline_parallel_group())
    return float((dense + expert).sqrt())
