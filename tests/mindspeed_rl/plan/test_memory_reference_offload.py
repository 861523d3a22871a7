"""The planner with the reference offloaded between its passes (``rl_config.use_integrated_worker``,
upstream's integrated worker): the reference's weights count only in the reference log-prob pass,
not at the training peak and not at a colocated engine start."""

from __future__ import annotations

import dataclasses

import pytest

from mindspeed_rl.plan.memory import (
    GB,
    START_CONTEXT_GB,
    ModelShape,
    RolloutMemorySpec,
    TrainerMemorySpec,
    activation_bytes,
    colocated_start,
    forward_activation_bytes,
    rank_parameters,
    reference_pass_memory,
    rollout_memory,
    trainer_memory,
)

# Shapes unlike any shipped recipe: odd widths, GQA, tied and untied, a small MoE.
SHAPES = {
    "dense_odd": ModelShape(
        num_layers=6, hidden_size=200, ffn_hidden_size=520, num_attention_heads=5, num_query_groups=1,
        head_dim=48, vocab_size=333, tied_embeddings=True, qkv_bias=True, qk_layernorm=False,
    ),
    "moe_small": ModelShape(
        num_layers=4, hidden_size=96, ffn_hidden_size=192, num_attention_heads=6, num_query_groups=2,
        head_dim=16, vocab_size=150, tied_embeddings=False, qkv_bias=False, qk_layernorm=True,
        num_experts=8, moe_topk=2, moe_ffn_hidden_size=40,
    ),
}  # fmt: skip


def _spec(shape: str, **overrides: object) -> TrainerMemorySpec:
    base = TrainerMemorySpec(
        shape=SHAPES[shape], tp=2, pp=2, ep=2 if SHAPES[shape].is_moe else 1, world_size=8,
        make_vocab_size_divisible_by=16, param_dtype="bfloat16", grads_in_fp32=True,
        distributed_optimizer=True, reference=True, reference_offloaded=True, micro_batch_size=2,
        seq_length=512, sequence_parallel=True, flash_attention=True, recompute_granularity=None,
    )  # fmt: skip
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("pp_rank", [0, 1])
def test_offloaded_reference_counts_only_in_its_own_pass(shape: str, pp_rank: int) -> None:
    spec = _spec(shape)
    kept = trainer_memory(dataclasses.replace(spec, reference_offloaded=False), 64, pp_rank=pp_rank)
    peak = trainer_memory(spec, 64, pp_rank=pp_rank)
    n = rank_parameters(spec.shape, tp=2, pp=2, ep=spec.ep, pp_rank=pp_rank, divisible_by=16).total
    assert kept.terms["reference"] == 2 * n and peak.terms["reference"] == 0
    assert kept.total - peak.total == 2 * n  # nothing else changes at the training peak
    ref_pass = reference_pass_memory(spec, 64, pp_rank=pp_rank)
    # The pass holds the policy's training state and the onloaded reference ...
    for term in ("parameters", "gradients", "optimizer_state", "reference", "headroom"):
        assert ref_pass.terms[term] == kept.terms[term], term
    # ... and one forward's activations, not the micro-batches 1F1B keeps for a backward.
    assert ref_pass.terms["activations"] == forward_activation_bytes(spec, pp_rank=pp_rank)
    assert 0 < ref_pass.terms["activations"] < activation_bytes(spec, pp_rank=pp_rank)
    assert ref_pass.total < kept.total


def test_forward_activations_follow_the_reference_micro_batch_and_the_last_stage() -> None:
    spec = _spec("dense_odd")
    one = forward_activation_bytes(dataclasses.replace(spec, reference_micro_batch_size=1), pp_rank=0)
    four = forward_activation_bytes(dataclasses.replace(spec, reference_micro_batch_size=4), pp_rank=0)
    assert four == pytest.approx(4 * one)  # per-token terms only on a first stage
    # The last stage also holds the logits and the chunked log-softmax.
    assert forward_activation_bytes(spec, pp_rank=1) > forward_activation_bytes(spec, pp_rank=0)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_colocated_start_keeps_no_offloaded_reference(shape: str) -> None:
    spec = _spec(shape)
    rollout = rollout_memory(
        RolloutMemorySpec(
            shape=spec.shape,
            tp=2,
            dtype="bfloat16",
            gpu_memory_utilization=0.8,
            max_model_len=512,
            max_num_seqs=4,
            max_num_batched_tokens=512,
        ),  # fmt: skip
        64,
    )
    parts = ("param", "grad", "optimizer")
    offloaded = colocated_start(
        trainer_memory(spec, 64), rollout, parts, gpu_memory_utilization=0.8, device_memory_gb=64
    )
    kept = colocated_start(
        trainer_memory(dataclasses.replace(spec, reference_offloaded=False), 64),
        rollout, parts, gpu_memory_utilization=0.8, device_memory_gb=64,
    )  # fmt: skip
    assert offloaded.total == pytest.approx(START_CONTEXT_GB * GB)
    assert (
        kept.total - offloaded.total == pytest.approx(kept.resident["reference"])
        and kept.resident["reference"] > 0
    )


def test_without_a_reference_there_is_no_reference_pass_term() -> None:
    spec = _spec("dense_odd", reference=False)
    assert trainer_memory(spec, 64).terms["reference"] == 0
    assert reference_pass_memory(spec, 64).terms["reference"] == 0
