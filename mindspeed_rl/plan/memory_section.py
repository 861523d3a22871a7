"""The memory section of the run plan: what ``plan.memory`` needs, read from the config, and the
per-rank / per-actor estimate of a placed plan (``check_config --cluster``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindspeed_rl.contracts import OffloadSpec, TrainerSpec
from mindspeed_rl.plan import pipeline
from mindspeed_rl.plan.memory import (
    DEFAULT_DEVICE_MEMORY_GB,
    GB,
    OFFLOADED_TERMS,
    SHRINK_HINTS,
    SWAP_OPTIMIZER_TIMES,
    ColocatedStart,
    MemoryEstimate,
    ModelShape,
    RolloutMemorySpec,
    TrainerMemorySpec,
    colocated_start,
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
            routing_replay=trainer.routing_replay is not None,
            cp=layout.context_parallel_size if layout else 1,
            swap_optimizer_times=SWAP_OPTIMIZER_TIMES if layout and layout.swap_optimizer else 0,
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
            routing_capture=trainer.routing_replay == "R3",
        ),
    )


def device_memory(kind: str | None, device_memory_gb: float | None) -> float:
    """GB of one device: the given figure, else the default of ``kind``; 0 on a CPU-only run."""
    return device_memory_gb or (DEFAULT_DEVICE_MEMORY_GB.get(kind, 0.0) if kind else 0.0)


def placed_memory(
    plan: MemoryPlan,
    placement: Placement,
    device_memory_gb: float | None,
    offload: OffloadSpec | None = None,
) -> dict[str, Any]:
    """``memory_gb`` for every trainer rank and rollout actor of ``placement``, and the first
    one that does not fit its device (as an error message), if any. ``offload``: a colocated
    hybrid's switches; its start-up sequence is then checked too (:func:`colocated_memory`)."""
    memory = device_memory(placement.request.device_kind, device_memory_gb)
    ranks_per_stage = max(1, plan.trainer.world_size // plan.trainer.pp)
    trainer = [
        trainer_memory(plan.trainer, memory, pp_rank=s.index // ranks_per_stage)
        for s in placement.trainer_ranks
    ]
    rollout = [rollout_memory(plan.rollout, memory) for _ in placement.generation_actors]
    problem = None
    if memory > 0:
        problem = _first_problem(trainer, plan, rollout, memory)
    out: dict[str, Any] = {
        "device_memory_gb": memory,
        "trainer_ranks": [e.as_gb() for e in trainer],
        "generation_actors": [e.as_gb() for e in rollout],
    }
    if plan.trainer.cp > 1:
        # What each trainer rank's activations were counted for: its share of every sequence.
        out["context_parallel"] = {
            "size": plan.trainer.cp,
            "tokens_per_rank": -(-plan.trainer.seq_length // plan.trainer.cp),
            "seq_length": plan.trainer.seq_length,
        }
    if offload is not None and memory > 0:
        start = colocated_memory(plan, offload, memory)
        out["colocated_start"] = start
        problem = problem or start["problem"]
    return {**out, "problem": problem}


def colocated_memory(plan: MemoryPlan, offload: OffloadSpec, memory_gb: float) -> dict[str, Any]:
    """The colocated start-up sequence (``plan.memory.ColocatedStart``) of the rank that keeps the
    most on its device (ranks differ only by pipeline stage), in GB, and the first reason a rank
    would not start or push (``problem``), naming the keys to change."""
    rollout = rollout_memory(plan.rollout, memory_gb)
    utilization = plan.rollout.gpu_memory_utilization
    starts = [
        colocated_start(
            trainer_memory(plan.trainer, memory_gb, pp_rank=stage),
            rollout,
            offload.all_parts(),
            gpu_memory_utilization=utilization,
            device_memory_gb=memory_gb,
            swapped_optimizer=plan.trainer.swap_optimizer_times > 0,
        )
        for stage in range(plan.trainer.pp)
    ]
    worst = max(range(len(starts)), key=lambda stage: starts[stage].total)
    problem = next(
        (
            why
            for stage, start in enumerate(starts)
            if (why := _start_problem(plan, stage, start)) is not None
        ),
        None,
    )
    return {"pipeline_stage": worst, **starts[worst].as_gb(), "problem": problem}


def _start_problem(plan: MemoryPlan, stage: int, start: ColocatedStart) -> str | None:
    device_gb = start.device / GB
    if not start.starts():
        utilization = plan.rollout.gpu_memory_utilization
        kept = ", ".join(f"{term} {size / GB:.1f} GB" for term, size in start.resident.items())
        return (
            f"colocated start-up: a trainer rank at pipeline stage {stage} keeps {start.total / GB:.1f} GB on "
            f"its {device_gb:g} GB device when its rollout engine starts ({kept}), more than the "
            f"{start.allowed / GB:.1f} GB vLLM leaves it: (1 - generate_config.gpu_memory_utilization "
            f"{utilization:g}) x {device_gb:g} GB; " + "; or ".join(_start_fixes(plan, start))
        )
    if not start.pushes():
        return (
            f"colocated push: a trainer rank at pipeline stage {stage} peaks at {start.push_peak / GB:.1f} GB of "
            f"its {device_gb:g} GB device while it pushes new weights (it keeps {start.total / GB:.1f} GB, its "
            "parameters are still on the device and the engine's weights are awake); raise "
            "generate_config.infer_tensor_parallel_size (smaller engine weights) or the trainer's "
            "model-parallel sizes"
        )
    return None


def _start_fixes(plan: MemoryPlan, start: ColocatedStart) -> list[str]:
    """The keys that make ``start`` fit, each with its number."""
    fixes = []
    device_gb = start.device / GB
    highest = math.floor((1.0 - start.total / start.device) * 100) / 100
    if highest > 0:
        lowered = dataclasses.replace(plan.rollout, gpu_memory_utilization=highest)
        why = rollout_shortfall(lowered, rollout_memory(lowered, device_gb))
        fixes.append(
            f"lower generate_config.gpu_memory_utilization to {highest:.2f} or less"
            + ("" if why is None else f" (but there {why}: also lower max_model_len or raise the engine TP)")
        )
    inverse = {term: part for part, term in OFFLOADED_TERMS.items()}
    fixes += [
        f"set generate_config.offload_train_{inverse[term]}: true (frees {start.resident[term] / GB:.1f} GB)"
        for term in start.resident
        if term in inverse and start.resident[term] > 0
    ]
    if start.resident.get("reference", 0.0) > 0:
        fixes.append(
            f"raise the trainer's model-parallel sizes (the reference, {start.resident['reference'] / GB:.1f} GB, "
            "is sharded like the policy and stays on the device)"
        )
    return fixes


def _first_problem(
    trainer: list[MemoryEstimate], plan: MemoryPlan, rollout: list[MemoryEstimate], memory: float
) -> str | None:
    for rank, est in enumerate(trainer):
        if not est.fits():
            term = est.largest()
            hint = SHRINK_HINTS[term]
            t = plan.trainer
            if term == "optimizer_state" and t.distributed_optimizer:
                hint = SHRINK_HINTS["optimizer_state_sharded"].format(
                    dp=t.dp, world=t.world_size, tp=t.tp, pp=t.pp
                )
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
