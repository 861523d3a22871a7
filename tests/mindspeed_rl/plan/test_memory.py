"""The memory planner: exact per-rank parameter counts against real megatron models, and the
arithmetic of the estimated terms."""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

import pytest

from mindspeed_rl.plan.memory import (
    GB,
    START_CONTEXT_GB,
    ModelShape,
    RolloutMemorySpec,
    TrainerMemorySpec,
    activation_bytes,
    colocated_start,
    largest_parameter,
    rank_parameters,
    rollout_memory,
    rollout_shortfall,
    trainer_memory,
)

# Shapes nobody tuned the planner on: odd widths, head_dim != hidden / heads, QKV bias, tied and
# untied, experts narrower than hidden / 2, a vocabulary megatron must pad.
SHAPES: dict[str, ModelShape] = {
    "dense_tied_bias": ModelShape(
        num_layers=2, hidden_size=96, ffn_hidden_size=160, num_attention_heads=4, num_query_groups=2,
        head_dim=24, vocab_size=201, tied_embeddings=True, qkv_bias=True, qk_layernorm=False,
    ),
    "dense_untied_qknorm": ModelShape(
        num_layers=4, hidden_size=64, ffn_hidden_size=96, num_attention_heads=8, num_query_groups=2,
        head_dim=40, vocab_size=100, tied_embeddings=False, qkv_bias=False, qk_layernorm=True,
    ),
    "moe_narrow_experts": ModelShape(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
        head_dim=32, vocab_size=130, tied_embeddings=False, qkv_bias=False, qk_layernorm=True,
        num_experts=6, moe_topk=2, moe_ffn_hidden_size=24,
    ),
}  # fmt: skip
LAYOUTS = {"tp2": (2, 1, 1), "pp2": (1, 2, 1), "ep2": (1, 1, 2)}


def _dims(shape: ModelShape) -> Any:
    from mindspeed_rl.weights.megatron_dims import GPTDims

    return GPTDims(
        family="qwen3_moe" if shape.is_moe else "qwen3",
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_query_groups,
        head_dim=shape.head_dim,
        vocab_size=shape.vocab_size,
        max_position_embeddings=64,
        rope_theta=10000.0,
        norm_epsilon=1e-6,
        tied_embeddings=shape.tied_embeddings,
        qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_layernorm,
        num_experts=shape.num_experts or None,
        moe_ffn_hidden_size=shape.moe_ffn_hidden_size or None,
        moe_topk=shape.moe_topk or None,
    )


def _count_worker(rank: int, port: int, layout_name: str, shapes: list[str], out: Any) -> None:
    import torch.distributed as dist

    from benchmarks.parity.engine import init_gloo
    from mindspeed_rl.models.training.megatron.layout import MegatronLayout
    from mindspeed_rl.models.training.megatron.model import build_gpt_model, init_model_parallel

    init_gloo(rank, 2, port)
    tp, pp, ep = LAYOUTS[layout_name]
    layout = MegatronLayout(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
        make_vocab_size_divisible_by=8,
    )  # fmt: skip
    init_model_parallel(layout, seed=0)
    from megatron.core import parallel_state as ps

    for name in shapes:
        moe = SHAPES[name].is_moe
        if (moe and tp > 1) or (not moe and ep > 1):
            continue  # MoE at TP > 1 needs sequence parallelism (not on CPU); EP needs experts
        model = build_gpt_model(_dims(SHAPES[name]), layout, param_dtype="float32")
        # By name: megatron flags expert parameters (``allreduce=False``) only when EP > 1.
        sizes = [(".experts." in n, p.numel()) for n, p in model.named_parameters()]
        dense = sum(size for is_expert, size in sizes if not is_expert)
        expert = sum(size for is_expert, size in sizes if is_expert)
        largest = max(p.numel() for p in model.parameters())
        out.put((layout_name, name, rank, ps.get_pipeline_model_parallel_rank(), dense, expert, largest))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
@pytest.mark.parametrize("layout_name", sorted(LAYOUTS))
def test_parameter_counts_equal_real_megatron_models(layout_name: str) -> None:
    from benchmarks.parity import ranks
    from benchmarks.parity.engine import free_port

    ctx = ranks.context()
    out = ctx.SimpleQueue()
    ranks.start_ranks(_count_worker, (free_port(), layout_name, sorted(SHAPES), out), 2)
    seen = 0
    tp, pp, ep = LAYOUTS[layout_name]
    while not out.empty():
        _, name, rank, pp_rank, dense, expert, largest = out.get()
        planned = rank_parameters(SHAPES[name], tp=tp, pp=pp, ep=ep, pp_rank=pp_rank, divisible_by=8)
        assert (planned.dense, planned.expert) == (dense, expert), (name, rank, pp_rank)
        # The swap optimizer's chunk bound: the largest tensor exactly for dense models; for MoE an
        # upper bound (the CPU build's SequentialMLP keeps one tensor per expert, the plan groups them).
        bound = largest_parameter(SHAPES[name], tp=tp, pp=pp, ep=ep, pp_rank=pp_rank, divisible_by=8)
        assert bound >= largest if SHAPES[name].is_moe else bound == largest, (name, rank, pp_rank)
        seen += 1
    assert seen >= 2 * (1 if layout_name == "ep2" else 2)  # every buildable shape, both ranks


def _trainer_spec(**overrides: Any) -> TrainerMemorySpec:
    base = TrainerMemorySpec(
        shape=SHAPES["moe_narrow_experts"], tp=1, pp=1, ep=2, world_size=4, make_vocab_size_divisible_by=8,
        param_dtype="bfloat16", grads_in_fp32=False, distributed_optimizer=False, reference=True,
        micro_batch_size=2, seq_length=128, sequence_parallel=False, flash_attention=False,
        recompute_granularity=None,
    )  # fmt: skip
    return dataclasses.replace(base, **overrides)


def test_byte_terms_follow_dtypes_and_sharding() -> None:
    spec = _trainer_spec()
    n = rank_parameters(spec.shape, tp=1, pp=1, ep=2, pp_rank=0, divisible_by=8)
    terms = trainer_memory(spec, 64).terms
    assert terms["parameters"] == 2 * n.total and terms["reference"] == 2 * n.total
    assert terms["gradients"] == 2 * n.total
    assert terms["optimizer_state"] == 12 * n.total  # fp32 masters + two fp32 moments
    assert trainer_memory(dataclasses.replace(spec, grads_in_fp32=True), 64).terms["gradients"] == 4 * n.total
    fp32 = trainer_memory(dataclasses.replace(spec, param_dtype="float32", reference=False), 64).terms
    assert fp32["optimizer_state"] == 8 * n.total and fp32["reference"] == 0
    # The distributed optimizer shards dense state over DP (world / TP / PP = 4) and expert state
    # over expert-DP (world / EP / PP = 2).
    sharded = trainer_memory(dataclasses.replace(spec, distributed_optimizer=True), 64).terms
    assert sharded["optimizer_state"] == pytest.approx(12 * (n.dense / 4 + n.expert / 2))


def test_colocated_start_up_counts_what_the_trainer_keeps_when_the_engine_starts() -> None:
    """The sequence of ``workers/colocation.py``: trainer built, offload_train_* parts gone,
    engine started (vLLM wants gpu_memory_utilization x device free), then each push."""
    spec = _trainer_spec()
    n = rank_parameters(spec.shape, tp=1, pp=1, ep=2, pp_rank=0, divisible_by=8).total
    trainer = trainer_memory(spec, 2.0)
    rollout_spec = RolloutMemorySpec(
        shape=spec.shape, tp=1, dtype="bfloat16", gpu_memory_utilization=0.75,
        max_model_len=256, max_num_seqs=8, max_num_batched_tokens=512,
    )  # fmt: skip
    rollout = rollout_memory(rollout_spec, 2.0)
    everything = colocated_start(
        trainer, rollout, ("param", "grad", "optimizer"), gpu_memory_utilization=0.75, device_memory_gb=2.0
    )
    # Only the reference (bf16 copy of the policy) and the runtime stay; activations are freed.
    assert everything.resident == {"reference": 2 * n, "runtime_context": START_CONTEXT_GB * GB}
    assert everything.allowed == pytest.approx(0.25 * 2.0 * GB)
    # The push: the parameters are still on the device, and the engine's weights are awake.
    assert everything.push_peak == pytest.approx(
        2 * n + START_CONTEXT_GB * GB + 2 * n + rollout.terms["weights"]
    )
    nothing = colocated_start(trainer, rollout, (), gpu_memory_utilization=0.75, device_memory_gb=2.0)
    assert nothing.total == pytest.approx((2 + 2 + 12 + 2) * n + START_CONTEXT_GB * GB)
    assert nothing.push_peak == pytest.approx(nothing.total + rollout.terms["weights"])
    only_grads = colocated_start(
        trainer, rollout, ("grad",), gpu_memory_utilization=0.75, device_memory_gb=2.0
    )
    assert set(only_grads.resident) == {"parameters", "optimizer_state", "reference", "runtime_context"}
    # 1.5 GB of runtime context alone exceeds a quarter of a 2 GB device; a 64 GB one leaves 16.
    assert not everything.starts() and everything.pushes() is (everything.push_peak <= 2.0 * GB)
    roomy = colocated_start(
        trainer_memory(spec, 64), rollout_memory(rollout_spec, 64), ("param", "grad", "optimizer"),
        gpu_memory_utilization=0.75, device_memory_gb=64,
    )  # fmt: skip
    assert roomy.starts() and roomy.pushes() and roomy.allowed == pytest.approx(16 * GB)


def test_recompute_flash_and_sequence_parallel_shrink_activations() -> None:
    plain = activation_bytes(_trainer_spec(tp=2, ep=1, world_size=2))
    flash = activation_bytes(_trainer_spec(tp=2, ep=1, world_size=2, flash_attention=True))
    sp = activation_bytes(
        _trainer_spec(tp=2, ep=1, world_size=2, flash_attention=True, sequence_parallel=True)
    )
    full = activation_bytes(
        _trainer_spec(tp=2, ep=1, world_size=2, flash_attention=True, sequence_parallel=True,
                      recompute_granularity="full", recompute_num_layers=1)
    )  # fmt: skip
    assert plain > flash > sp > full > 0
    # The quadratic attention term alone: 6 a s^2 b / t bytes per layer in bf16 (the fp32 softmax
    # output and the bf16 probabilities; test_unfused_attention_scores_equal_what_megatron_keeps).
    shape = SHAPES["moe_narrow_experts"]
    assert plain - flash == pytest.approx(shape.num_layers * 6 * 4 * 128**2 * 2 / 2)


def test_context_parallelism_divides_every_per_token_term_by_cp() -> None:
    shape = SHAPES["dense_untied_qknorm"]
    vocab = shape.padded_vocab(1, 8)
    log_prob_chunk = 3 * 4 * 1024 * vocab  # min(1024, s * b): the same 1024 tokens either way
    for flash in (True, False):
        spec = _trainer_spec(shape=shape, ep=1, world_size=2, seq_length=1024, flash_attention=flash)
        cp2 = activation_bytes(dataclasses.replace(spec, cp=2))
        half = activation_bytes(dataclasses.replace(spec, seq_length=512))
        # A CP2 rank holds what a rank of half the sequence holds, except that its queries attend
        # to every key (twice the unfused score matrix) and log-probs cover every response token.
        scores = 0 if flash else shape.num_layers * 6 * shape.num_attention_heads * 512 * 512 * 2
        half_chunk = 3 * 4 * min(1024, 512 * 2) * vocab
        assert cp2 == pytest.approx(half + scores + log_prob_chunk - half_chunk)
        assert cp2 < activation_bytes(spec)


def test_pipeline_stages_hold_their_in_flight_micro_batches() -> None:
    spec = _trainer_spec(shape=SHAPES["dense_untied_qknorm"], pp=2, ep=1, world_size=2)
    first, last = activation_bytes(spec, pp_rank=0), activation_bytes(spec, pp_rank=1)
    # The same two layers on one stage: one micro-batch in flight, plus the logits.
    two_layers = dataclasses.replace(spec.shape, num_layers=2)
    one_stage = activation_bytes(dataclasses.replace(spec, pp=1, world_size=1, shape=two_layers))
    vocab = spec.shape.padded_vocab(1, 8)
    tokens = spec.seq_length * spec.micro_batch_size
    logits = 2 * tokens * vocab + 3 * 4 * min(1024, tokens) * vocab
    assert last == pytest.approx(one_stage)
    assert first == pytest.approx(2 * (one_stage - logits))  # 1F1B: stage 0 holds PP micro-batches


def test_rollout_kv_cache_is_what_vllm_leaves() -> None:
    spec = RolloutMemorySpec(
        shape=SHAPES["dense_untied_qknorm"], tp=2, dtype="bfloat16", gpu_memory_utilization=0.5,
        max_model_len=256, max_num_seqs=8, max_num_batched_tokens=512,
    )  # fmt: skip
    est = rollout_memory(spec, 1.0)
    assert est.total == pytest.approx(0.5 * GB)
    assert rollout_shortfall(spec, est) is None
    tiny = rollout_memory(spec, 1e-5)
    assert rollout_shortfall(spec, tiny) is not None


# The engine's memory terms, measured: the real megatron engine (and its reference) at TP2, PP2
# (tied embeddings: the last stage's output-layer copy) and EP2, bf16 with bf16 or fp32 gradient
# buffers, and fp32.
ENGINE_CASES = {"tp2": "qwen3", "pp2": "qwen2", "ep2": "qwen3_moe"}
ENGINE_DTYPES = (("bfloat16", False), ("bfloat16", True), ("float32", False))


def _shape_of(dims: Any) -> ModelShape:
    return ModelShape(
        num_layers=dims.num_layers, hidden_size=dims.hidden_size, ffn_hidden_size=dims.ffn_hidden_size,
        num_attention_heads=dims.num_attention_heads, num_query_groups=dims.num_query_groups,
        head_dim=dims.head_dim, vocab_size=dims.vocab_size, tied_embeddings=dims.tied_embeddings,
        qkv_bias=dims.qkv_bias, qk_layernorm=dims.qk_layernorm, num_experts=dims.num_experts or 0,
        moe_topk=dims.moe_topk or 0, moe_ffn_hidden_size=dims.moe_ffn_hidden_size or 0,
    )  # fmt: skip


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _engine_memory_worker(rank: int, port: int, layout_name: str, model_dir: str, out: Any) -> None:
    import numpy as np
    import torch.distributed as dist

    from benchmarks.parity.engine import LAYOUTS, init_gloo

    init_gloo(rank, 2, port)
    try:
        import torch
        from megatron.core import parallel_state as ps

        from mindspeed_rl.models.loss.config import GRPOLossConfig
        from mindspeed_rl.models.training.batch import TrainBatch
        from mindspeed_rl.models.training.engine_config import TorchEngineConfig
        from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
        from mindspeed_rl.models.training.megatron.reference import MegatronReferenceModel

        layout = LAYOUTS[layout_name]
        batch = TrainBatch.from_lists(
            prompt_ids=[[3, 4, 5], [6, 7]],
            response_ids=[[8, 9], [10, 11, 12]],
            advantages=np.array([1.0, -1.0]),
        )
        for dtype, grads_in_fp32 in ENGINE_DTYPES:
            config = TorchEngineConfig(
                lr=1e-3, micro_batch_size=1, mini_batch_size=2, n_samples_per_prompt=1,
                loss=GRPOLossConfig(init_kl_coef=0.0), param_dtype=dtype,  # type: ignore[arg-type]
                accumulate_allreduce_grads_in_fp32=grads_in_fp32,
            )  # fmt: skip
            engine = MegatronTrainingEngine(model_dir, config, layout)
            reference = MegatronReferenceModel(model_dir, layout, micro_batch_size=1, param_dtype=dtype)
            engine.update(batch, 1.0)  # AdamW allocates its moments on the first step
            inner = engine.optimizer.torch_optimizer
            state = [t for s in inner.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
            moments = [t for t in state if t.dim() > 0]
            counters = [t for t in state if t.dim() == 0]
            measured = {
                "parameters": _nbytes(engine.model.module.parameters()),
                "gradients": _nbytes(
                    b.grad_data for b in [*engine.model.buffers, *engine.model.expert_parallel_buffers]
                ),
                "optimizer_state": _nbytes(moments) + _nbytes(engine.optimizer.master_params or []),
                "reference": _nbytes(reference.model.parameters()),
            }
            # Besides, torch's AdamW keeps a 0-dim step counter per tensor: bookkeeping, not a term.
            assert len(moments) + len(counters) == len(state) and len(counters) == len(inner.state)
            out.put((rank, ps.get_pipeline_model_parallel_rank(), dtype, grads_in_fp32, measured))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
@pytest.mark.parametrize("layout_name", sorted(ENGINE_CASES))
def test_byte_terms_equal_what_the_megatron_engine_allocates(tmp_path: Any, layout_name: str) -> None:
    """``parameters``, ``gradients`` (megatron DDP's buffer), ``optimizer_state`` (fp32 masters +
    AdamW moments after a step, on the CPU path) and ``reference``, byte for byte per rank."""
    from benchmarks.parity import ranks
    from benchmarks.parity.engine import free_port
    from benchmarks.parity.models import build_parity_model
    from mindspeed_rl.weights.megatron_dims import load_dims

    family = ENGINE_CASES[layout_name]
    model_dir = build_parity_model(tmp_path / family, family, tied=family == "qwen2")
    ctx = ranks.context()
    out = ctx.SimpleQueue()
    ranks.start_ranks(_engine_memory_worker, (free_port(), layout_name, str(model_dir), out), 2)
    tp, pp, ep = LAYOUTS[layout_name]
    shape = _shape_of(load_dims(model_dir))
    seen = 0
    while not out.empty():
        rank, pp_rank, dtype, grads_in_fp32, measured = out.get()
        spec = _trainer_spec(
            shape=shape, tp=tp, pp=pp, ep=ep, world_size=2, make_vocab_size_divisible_by=128,
            param_dtype=dtype, grads_in_fp32=grads_in_fp32, distributed_optimizer=False, reference=True,
        )  # fmt: skip
        planned = trainer_memory(spec, 80, pp_rank=pp_rank).terms
        assert {k: planned[k] for k in measured} == measured, (layout_name, rank, dtype, grads_in_fp32)
        seen += 1
    assert seen == 2 * len(ENGINE_DTYPES)


def _scores_worker(rank: int, port: int, cases: list[tuple[int, int, int, int, str]], out: Any) -> None:
    """Megatron's local DotProductAttention (the CPU / no-TE spec) on one rank: for each case, the
    bytes autograd keeps in tensors of attention-score shape (``[..., s, s]``, one per head)."""
    import torch
    import torch.distributed as dist

    from benchmarks.parity.engine import init_gloo
    from mindspeed_rl.models.training.megatron.layout import MegatronLayout
    from mindspeed_rl.models.training.megatron.model import init_model_parallel
    from mindspeed_rl.models.training.megatron.patches import causal_attention_mask

    init_gloo(rank, 1, port)
    init_model_parallel(MegatronLayout(), seed=0)
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    for heads, groups, seq, batch, dtype_name in cases:
        dtype = getattr(torch, dtype_name)
        d = 16
        config = TransformerConfig(
            num_layers=1, hidden_size=heads * d, num_attention_heads=heads, num_query_groups=groups,
            kv_channels=d, attention_dropout=0.0, hidden_dropout=0.0, params_dtype=dtype,
            bf16=dtype == torch.bfloat16,
        )  # fmt: skip
        attention = DotProductAttention(config, 1, AttnMaskType.causal, "self")
        q = torch.randn(seq, batch, heads, d, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(seq, batch, groups, d, dtype=dtype, requires_grad=True) for _ in range(2))
        kept: dict[int, int] = {}

        def pack(
            t: torch.Tensor, kept: dict[int, int] = kept, s: int = seq, n: int = batch * heads
        ) -> torch.Tensor:
            if t.dim() >= 2 and tuple(t.shape[-2:]) == (s, s) and t.numel() >= n * s * s:
                kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            # The engine's explicit causal mask (megatron's default one is built on "cuda").
            mask = causal_attention_mask(seq, "cpu")
            attention(q, k, v, attention_mask=mask).float().sum().backward()
        out.put(((heads, groups, seq, batch, dtype_name), sum(kept.values())))
    dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
def test_unfused_attention_scores_equal_what_megatron_keeps() -> None:
    """The planner's s x s term without flash attention (``unfused_score_bytes``) against the
    bytes megatron's real local attention keeps for backward, on head counts, GQA groups, lengths
    and dtypes the planner's own shapes do not use."""
    from benchmarks.parity import ranks
    from benchmarks.parity.engine import free_port
    from mindspeed_rl.plan.memory import unfused_score_bytes

    cases = [(4, 2, 48, 2, "bfloat16"), (6, 6, 40, 1, "bfloat16"), (4, 1, 32, 3, "float32")]
    ctx = ranks.context()
    out = ctx.SimpleQueue()
    ranks.start_ranks(_scores_worker, (free_port(), cases, out), 1)
    measured = {}
    while not out.empty():
        case, nbytes = out.get()
        measured[tuple(case)] = nbytes
    assert set(measured) == set(cases)
    for heads, groups, seq, batch, dtype in cases:
        planned = unfused_score_bytes(dtype) * heads * seq * seq * batch
        assert measured[(heads, groups, seq, batch, dtype)] == planned, (heads, groups, seq, batch, dtype)
