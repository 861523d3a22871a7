"""Megatron/NPU keys that upstream YAML carries.

They are accepted (so upstream YAML keeps working) and typed (so typos still fail). Most are
inert everywhere; ``use_mcore_models`` and the four parallel sizes are read by the megatron engine
and so are inert only on the torch engine (``fields.opt(inert_on_torch=...)``). ``check_config``
lists the ones a user set that have no effect on the chosen engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindspeed_rl.config_cls.fields import MEGATRON_ONLY, PARALLEL_ONLY, opt

_RECOMPUTE = "Megatron activation recomputation; the torch backend keeps activations"


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelKeys:
    """Megatron parallel layout of a training role (actor, reference, reward, critic)."""

    tensor_model_parallel_size: int = opt(1, "Tensor-parallel ranks.", inert_on_torch=PARALLEL_ONLY)
    pipeline_model_parallel_size: int = opt(1, "Pipeline stages.", inert_on_torch=PARALLEL_ONLY)
    expert_model_parallel_size: int = opt(1, "Expert-parallel ranks (MoE).", inert_on_torch=PARALLEL_ONLY)
    context_parallel_size: int = opt(
        1, "Context-parallel ranks (the megatron engine implements 1 only).", inert_on_torch=PARALLEL_ONLY
    )
    num_layers_per_virtual_pipeline_stage: int | None = opt(
        None, "Interleaved pipeline chunk size.", inert=PARALLEL_ONLY
    )
    sequence_parallel: bool = opt(
        False,
        "Shard activations along the sequence over the TP group (TP > 1).",
        inert_on_torch=PARALLEL_ONLY,
    )
    moe_tp_extend_ep: bool = opt(
        False,
        "MoE: spread the experts over TP x EP ranks, each expert whole (not split over TP), as "
        "MindSpeed's moe_tp_extend_ep; the megatron engine builds megatron-core's expert parallelism "
        "over expert_model_parallel_size x tensor_model_parallel_size ranks at expert TP 1.",
        inert_on_torch=PARALLEL_ONLY,
    )
    num_layer_list: str | int | tuple[int, ...] | None = opt(
        None,
        "Layers per pipeline stage, comma-separated (e.g. 16,17,16,15; summing to num_layers, noop "
        "layers included); null = num_layers / pipeline_model_parallel_size each.",
        inert_on_torch=PARALLEL_ONLY,
    )
    noop_layers: str | int | tuple[int, ...] | None = opt(
        None,
        "0-based indices, among num_layers, of identity layers that pad the model for the pipeline "
        "split (e.g. 5,95 makes Qwen3-235B's 94 layers 96); they hold no weights and are absent "
        "from the HF export.",
        inert_on_torch=PARALLEL_ONLY,
    )
    use_distributed_optimizer: bool = opt(
        False,
        "Shard fp32 masters and Adam moments over data parallel (megatron, GPU/NPU).",
        inert_on_torch=PARALLEL_ONLY,
    )
    overlap_grad_reduce: bool = opt(False, "Overlap DP gradient reduce.", inert=PARALLEL_ONLY)
    overlap_param_gather: bool = opt(False, "Overlap DP parameter gather.", inert=PARALLEL_ONLY)
    distributed_backend: str = opt("nccl", "Collective backend (nccl/hccl/gloo).", inert=PARALLEL_ONLY)


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronOnlyKeys:
    """Kernel, memory and checkpoint-format switches of Megatron/MindSpeed."""

    use_mcore_models: bool = opt(
        False, "Train on the megatron-core engine with actor_config's layout.", inert_on_torch=MEGATRON_ONLY
    )
    use_fused_rmsnorm: bool = opt(
        False, "Fused RMSNorm kernel (MindSpeed on NPU).", inert_on_torch=MEGATRON_ONLY
    )
    use_fused_swiglu: bool = opt(False, "Fused SwiGLU kernel.", inert_on_torch=MEGATRON_ONLY)
    use_fused_rotary_pos_emb: bool = opt(False, "Fused RoPE kernel.", inert_on_torch=MEGATRON_ONLY)
    use_rotary_position_embeddings: bool = opt(False, "Legacy RoPE switch.", inert=MEGATRON_ONLY)
    use_flash_attn: bool = opt(
        False, "Flash attention (TransformerEngine on CUDA, MindSpeed on NPU).", inert_on_torch=MEGATRON_ONLY
    )
    use_fused_moe_token_permute_and_unpermute: bool = opt(False, "Fused MoE permute.", inert=MEGATRON_ONLY)
    no_masked_softmax_fusion: bool = opt(False, "Disable fused masked softmax.", inert=MEGATRON_ONLY)
    no_bias_dropout_fusion: bool = opt(False, "Disable fused bias-dropout.", inert=MEGATRON_ONLY)
    no_rope_fusion: bool = opt(False, "Disable fused RoPE.", inert=MEGATRON_ONLY)
    attention_softmax_in_fp32: bool = opt(False, "Softmax in fp32 under bf16.", inert=MEGATRON_ONLY)
    no_gradient_accumulation_fusion: bool = opt(False, "Disable fused grad accum.", inert=MEGATRON_ONLY)
    gemm_gradient_accumulation_fusion: bool = opt(False, "Fused GEMM grad accum.", inert=MEGATRON_ONLY)
    reuse_fp32_param: bool = opt(False, "Share fp32 master weights memory.", inert=MEGATRON_ONLY)
    use_cpu_initialization: bool = opt(False, "Initialise weights on CPU.", inert=MEGATRON_ONLY)
    use_mc2: bool = opt(False, "Ascend MC2 fused communication.", inert=MEGATRON_ONLY)
    recompute_granularity: str | None = opt(None, "full or selective.", inert_on_torch=_RECOMPUTE)
    recompute_method: str | None = opt(None, "uniform or block (with full).", inert_on_torch=_RECOMPUTE)
    recompute_num_layers: int | None = opt(
        None, "Layers per recomputed chunk (full).", inert_on_torch=_RECOMPUTE
    )
    swap_attention: bool = opt(False, "Swap attention activations to host.", inert=_RECOMPUTE)
    no_shared_storage: bool = opt(False, "Nodes do not share a file system.", inert=MEGATRON_ONLY)
    load_checkpoint_loosely: bool = opt(False, "Allow missing keys on load.", inert=MEGATRON_ONLY)
    ckpt_format: str = opt("torch", "Megatron checkpoint format.", inert=MEGATRON_ONLY)
    initial_loss_scale: float = opt(4294967296.0, "fp16 dynamic loss scale start.", inert=MEGATRON_ONLY)
    accumulate_allreduce_grads_in_fp32: bool = opt(
        False,
        "Accumulate and all-reduce gradients in fp32 under bf16 (megatron's grad buffer).",
        inert_on_torch=MEGATRON_ONLY,
    )
