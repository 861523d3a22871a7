"""How the megatron engine spreads the model over ranks beyond the four parallel sizes: upstream's
uneven pipeline stages and noop layers (``num_layer_list``, ``noop_layers``), and MindSpeed's
``moe_tp_extend_ep``. Torch-free, like the rest of the plan."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from mindspeed_rl.models.training.megatron import stages

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.config_cls.model_arch import ModelArchitecture


def stage_layers(config: GRPOConfig) -> tuple[int, ...]:
    """Real layers per pipeline stage (``stages.stage_layers``); () = megatron's even split."""
    p = config.actor_config.parallel
    return stages.stage_layers(
        num_layers=config.model.num_layers,
        pipeline_parallel_size=p.pipeline_model_parallel_size,
        num_layer_list=p.num_layer_list,
        noop_layers=p.noop_layers,
    )


def real_architecture(config: GRPOConfig) -> ModelArchitecture:
    """The model as it holds weights: ``num_layers`` without the noop layers (upstream counts
    them in it, e.g. 96 for Qwen3-235B's 94)."""
    arch = config.model
    noops = config.actor_config.parallel.noop_layers
    if noops is None or not arch.num_layers:
        return arch
    return dataclasses.replace(arch, num_layers=stages.real_num_layers(arch.num_layers, noops))


def expert_parallel_size(config: GRPOConfig) -> int:
    """Ranks the experts are spread over. ``moe_tp_extend_ep`` (MindSpeed's) folds the TP ranks
    into expert parallelism: experts over EP x TP ranks, whole on each (megatron-core's expert
    parallel folding at expert TP 1, megatron-core 0.12.1 and 0.19.2 ``initialize_model_parallel``),
    so a rank holds num_experts / (EP x TP) of them instead of a TP slice of num_experts / EP."""
    p = config.actor_config.parallel
    fold = p.tensor_model_parallel_size if p.moe_tp_extend_ep and config.model.is_moe else 1
    return p.expert_model_parallel_size * fold
