"""The memory section of the run plan: what ``plan.memory`` needs, read from the config, and the
per-rank / per-actor estimate of a placed plan (``check_config --cluster``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindspeed_rl.contracts import TrainerSpec
from mindspeed_rl.plan import pipeline
from mindspeed_rl.plan.memory import (
    DEFAULT_DEVICE_MEMORY_GB,
    SHRINK_HINTS,
    MemoryEstimate,
    ModelShape,
    RolloutMemorySpec,
    TrainerMemorySpec,
    rollout_memory,
    rollout_shortfall,
    trainer_memory,
)

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.utils.placement import Placement


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPlan:
    trainer: TrainerMemorySpec
    rollout: RolloutMemorySpec


def memory_plan(
    config: GRPOConfig, trainer: TrainerSpec, rollout_tp: int, *, rollout_ep: int = 0
) -> MemoryPlan | None:
    """None when the YAML's ``model:`` section does not give the shape (an HF folder's own
    config.json then describes it, which the planner does not read). ``rollout_ep``: workers each
    engine's experts are spread over (``RolloutMemorySpec.expert_parallel``)."""
    arch = pipeline.real_architecture(config)  # noop layers hold nothing
    vocab = arch.padded_vocab_size or 0
    if not (arch.num_layers and arch.hidden_size and arch.num_attention_heads and vocab):
        return None
    shape = ModelShape(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_kv_heads,
        head_dim=arch.head_dim,
        vocab_size=vocab,
        tied_embeddings=not arch.untie_embeddings_and_output_weights,
        qkv_bias=arch.add_qkv_bias,
        qk_layernorm=arch.qk_layernorm,
        num_experts=arch.num_experts or 0,
        moe_topk=arch.moe_router_topk if arch.is_moe else 0,
        moe_ffn_hidden_size=(arch.moe_ffn_hidden_size or 0) if arch.is_moe else 0,
    )
    engine, layout = trainer.engine, trainer.megatron
    g = config.generate_config
    seq_length = config.rl_config.max_prompt_length + g.sampling_config.max_tokens
    return MemoryPlan(
        trainer=TrainerMemorySpec(
            shape=shape,
            tp=layout.tensor_model_parallel_size if layout else 1,
            pp=layout.pipeline_model_parallel_size if layout else 1,
            ep=layout.expert_model_parallel_size if layout else 1,
            world_size=trainer.num_ranks,
            make_vocab_size_divisible_by=layout.make_vocab_size_divisible_by if layout else 1,
            param_dtype=engine.param_dtype,
            grads_in_fp32=engine.accumulate_allreduce_grads_in_fp32 or engine.param_dtype == "float32",
            distributed_optimizer=engine.use_distributed_optimizer and engine.device != "cpu",
            reference=trainer.reference_micro_batch_size is not None,
            micro_batch_size=engine.micro_batch_size,
            seq_length=seq_length,
            sequence_parallel=bool(layout and layout.sequence_parallel),
            flash_attention=bool(layout and layout.use_flash_attn),
            recompute_granularity=layout.recompute_granularity if layout else None,  # type: ignore[arg-type]
            recompute_num_layers=layout.recompute_num_layers if layout else None,
            recompute_method=layout.recompute_method if layout else None,  # type: ignore[arg-type]
            stage_layers=layout.stage_layers if layout else (),
        ),
        rollout=RolloutMemorySpec(
            shape=shape,
            tp=rollout_tp,
            expert_parallel=rollout_ep,
            dtype=engine.param_dtype if g.dtype == "auto" else g.dtype,
            gpu_memory_utilization=g.gpu_memory_utilization,
            max_model_len=g.max_model_len or seq_length,
            max_num_seqs=g.max_num_seqs,
            max_num_batched_tokens=g.max_num_batched_tokens or (g.max_model_len or seq_length),
        ),
    )


def placed_memory(plan: MemoryPlan, placement: Placement, device_memory_gb: float | None) -> dict[str, Any]:
    """``memory_gb`` for every trainer rank and rollout actor of ``placement``, and the first
    one that does not fit its device (as an error message), if any."""
    kind = placement.request.device_kind
    memory = device_memory_gb or (DEFAULT_DEVICE_MEMORY_GB.get(kind, 0.0) if kind else 0.0)
    ranks_per_stage = max(1, plan.trainer.world_size // plan.trainer.pp)
    trainer = [
        trainer_memory(plan.trainer, memory, pp_rank=s.index // ranks_per_stage)
        for s in placement.trainer_ranks
    ]
    rollout = [rollout_memory(plan.rollout, memory) for _ in placement.generation_actors]
    problem = None
    if memory > 0:
        problem = _first_problem(trainer, plan, rollout, memory)
    return {
        "device_memory_gb": memory,
        "trainer_ranks": [e.as_gb() for e in trainer],
        "generation_actors": [e.as_gb() for e in rollout],
        "problem": problem,
    }


def _first_problem(
    trainer: list[MemoryEstimate], plan: MemoryPlan, rollout: list[MemoryEstimate], memory: float
) -> str | None:
    for rank, est in enumerate(trainer):
        if not est.fits():
            term = est.largest()
            hint = SHRINK_HINTS[term]
            if term != "activations" and plan.trainer.recompute_granularity != "full":
                hint += f"; or cut activations ({est.terms['activations'] / 1e9:.1f} GB): {SHRINK_HINTS['activations']}"
            return (
                f"trainer rank {rank} needs {est.total / 1e9:.1f} GB of its {memory:g} GB device (largest "
                f"term: {term} {est.terms[term] / 1e9:.1f} GB); {hint}"
            )
    for index, est in enumerate(rollout):
        why = rollout_shortfall(plan.rollout, est)
        if why is not None:
            return (
                f"generation actor {index}: {why}; raise async_config.actor_tensor_parallel_size (or "
                "generate_config.infer_tensor_parallel_size), generate_config.gpu_memory_utilization, or "
                "lower max_model_len / max_num_batched_tokens"
            )
    return None
