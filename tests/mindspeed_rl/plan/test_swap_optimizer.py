"""MindSpeed's swap optimizer in the plan: which stacks honour upstream's ``swap_optimizer``, the
flags MindSpeed's adaptor then sees, and the planner's optimizer term (one swap chunk during a
step, nothing at a colocated engine start)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mindspeed_rl.models.training.megatron.checkpoint import optimizer_sharding
from mindspeed_rl.models.training.megatron.layout import MegatronLayout
from mindspeed_rl.models.training.megatron.patches import mindspeed_argv
from mindspeed_rl.plan.memory import (
    SWAP_OPTIMIZER_TIMES,
    ModelShape,
    RolloutMemorySpec,
    TrainerMemorySpec,
    colocated_start,
    largest_parameter,
    rank_parameters,
    rollout_memory,
    swap_chunk,
    trainer_memory,
)

DENSE = ModelShape(
    num_layers=6, hidden_size=320, ffn_hidden_size=896, num_attention_heads=10, num_query_groups=5,
    head_dim=48, vocab_size=1000, tied_embeddings=False, qkv_bias=True, qk_layernorm=False,
)  # fmt: skip
MOE = ModelShape(
    num_layers=4, hidden_size=256, ffn_hidden_size=512, num_attention_heads=8, num_query_groups=2,
    head_dim=32, vocab_size=500, tied_embeddings=False, qkv_bias=False, qk_layernorm=True,
    num_experts=12, moe_topk=2, moe_ffn_hidden_size=96,
)  # fmt: skip


def _spec(shape: ModelShape, **overrides: Any) -> TrainerMemorySpec:
    base = TrainerMemorySpec(
        shape=shape, tp=2, pp=2, ep=1, world_size=8, make_vocab_size_divisible_by=8,
        param_dtype="bfloat16", grads_in_fp32=False, distributed_optimizer=True, reference=True,
        micro_batch_size=1, seq_length=256, sequence_parallel=True, flash_attention=True,
        recompute_granularity=None,
    )  # fmt: skip
    return dataclasses.replace(base, **overrides)


def test_swap_chunk_is_a_share_of_the_shard_or_one_larger_parameter() -> None:
    assert swap_chunk(1600, 50, 16) == 100  # small tensors: chunks of shard // times
    assert swap_chunk(1600, 300, 16) == 300  # one tensor larger than a chunk goes in alone
    assert swap_chunk(200, 5000, 16) == 200  # ... but never more than the rank's shard


def test_largest_parameter_by_stage() -> None:
    vocab_rows = DENSE.padded_vocab(2, 8) // 2
    first = largest_parameter(DENSE, tp=2, pp=3, ep=1, pp_rank=0, divisible_by=8)
    middle = largest_parameter(DENSE, tp=2, pp=3, ep=1, pp_rank=1, divisible_by=8)
    assert first == max(vocab_rows * 320, 2 * 896 * 320 // 2)
    assert middle == 2 * 896 * 320 // 2  # gate+up linear_fc1 over TP, the widest layer tensor
    # MoE: a stage's local experts as one grouped fc1 (GroupedMLP weight1), EP splitting them.
    assert largest_parameter(MOE, tp=1, pp=4, ep=3, pp_rank=1, divisible_by=8) == 12 // 3 * 2 * 96 * 256


@pytest.mark.parametrize(("shape", "ep"), [(DENSE, 1), (MOE, 2)])
def test_swapped_optimizer_term_is_one_chunk_of_the_sharded_state(shape: ModelShape, ep: int) -> None:
    plain = _spec(shape, ep=ep)
    swapped = dataclasses.replace(plain, swap_optimizer_times=SWAP_OPTIMIZER_TIMES)
    for stage in range(2):
        params = rank_parameters(shape, tp=2, pp=2, ep=ep, pp_rank=stage, divisible_by=8)
        shard = params.dense / plain.dp + params.expert / plain.expert_dp
        assert trainer_memory(plain, 64, pp_rank=stage).terms["optimizer_state"] == pytest.approx(12 * shard)
        biggest = largest_parameter(shape, tp=2, pp=2, ep=ep, pp_rank=stage, divisible_by=8)
        chunk = swap_chunk(int(shard), biggest, SWAP_OPTIMIZER_TIMES)
        with_swap = trainer_memory(swapped, 64, pp_rank=stage)
        assert with_swap.terms["optimizer_state"] == 12 * chunk < 12 * shard
        # Nothing else moves: parameters, gradients, the reference and activations stay.
        others = {k: v for k, v in with_swap.terms.items() if k != "optimizer_state"}
        assert others == {
            k: v for k, v in trainer_memory(plain, 64, pp_rank=stage).terms.items() if k in others
        }


def test_a_swapped_optimizer_is_not_on_the_device_when_the_colocated_engine_starts() -> None:
    spec = _spec(DENSE, swap_optimizer_times=SWAP_OPTIMIZER_TIMES)
    rollout = rollout_memory(
        RolloutMemorySpec(
            shape=DENSE, tp=1, dtype="bfloat16", gpu_memory_utilization=0.5, max_model_len=256,
            max_num_seqs=4, max_num_batched_tokens=256,
        ),
        1.0,
    )  # fmt: skip
    trainer = trainer_memory(spec, 1.0)
    kept = colocated_start(trainer, rollout, ["param"], gpu_memory_utilization=0.5, device_memory_gb=1.0)
    swapped = colocated_start(
        trainer, rollout, ["param"], gpu_memory_utilization=0.5, device_memory_gb=1.0, swapped_optimizer=True
    )
    assert kept.resident["optimizer_state"] == trainer.terms["optimizer_state"] > 0
    assert "optimizer_state" not in swapped.resident
    assert kept.total - swapped.total == pytest.approx(trainer.terms["optimizer_state"])


def test_mindspeed_sees_swap_optimizer_with_the_distributed_optimizer() -> None:
    flags = mindspeed_argv(MegatronLayout(swap_optimizer=True))
    assert "--swap-optimizer" in flags and "--use-distributed-optimizer" in flags
    assert "--swap-optimizer" not in mindspeed_argv(MegatronLayout())


def test_a_swapping_layout_checkpoints_its_optimizer_through_the_format_mindspeed_overrides() -> None:
    # MindSpeed's SwapDistributedOptimizer reads its host buffers only in megatron's dp_zero path.
    assert optimizer_sharding(MegatronLayout(swap_optimizer=True)) == {
        "sharding_type": "dp_zero_gather_scatter"
    }
    assert "sharding_type" not in optimizer_sharding(MegatronLayout())  # the installed megatron's choice
