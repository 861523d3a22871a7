"""Megatron/NPU keys that upstream YAML carries.

They are accepted (so upstream YAML keeps working) and typed (so typos still fail). Most are
inert everywhere; ``use_mcore_models`` and the four parallel sizes are read by the megatron engine
and so are inert only on the torch engine (``fields.opt(inert_on_torch=...)``). ``check_config``
lists the ones a user set that have no effect on the chosen engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindspeed_rl.config_cls.fields import (
    MEGATRON_ONLY,
    PARALLEL_ONLY,
    TORCH_ONE_REPLICA,
    ByEngine,
    megatron_reason,
    opt,
)

_RECOMPUTE = "Megatron activation recomputation; the torch backend keeps activations"
# What the megatron engine does instead (models/training/megatron/model.py, optimizer.py,
# workers/training_group.py), so a megatron user reads why, not "the torch backend ignores it".
_NO_OVERLAP = megatron_reason(
    "the megatron engine does not overlap data-parallel communication with compute (same results)",
    torch=TORCH_ONE_REPLICA,
)
_FUSED_OFF = "the megatron engine keeps this fusion off on every device"


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelKeys:
    """Megatron parallel layout of a training role (actor, reference, reward, critic)."""

    tensor_model_parallel_size: int = opt(1, "Tensor-parallel ranks.", inert_on_torch=PARALLEL_ONLY)
    pipeline_model_parallel_size: int = opt(1, "Pipeline stages.", inert_on_torch=PARALLEL_ONLY)
    expert_model_parallel_size: int = opt(1, "Expert-parallel ranks (MoE).", inert_on_torch=PARALLEL_ONLY)
    context_parallel_size: int = opt(
        1,
        "Ranks each sequence is split over (context parallelism, context_parallel_algo); the megatron "
        "engine needs TransformerEngine (CUDA) or MindSpeed (NPU) for the attention across them.",
        inert_on_torch=PARALLEL_ONLY,
    )
    num_layers_per_virtual_pipeline_stage: int | None = opt(
        None,
        "Interleaved pipeline chunk size.",
        inert=megatron_reason(
            "the megatron engine runs the non-interleaved pipeline schedule (same results)",
            torch=TORCH_ONE_REPLICA,
        ),
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
    overlap_grad_reduce: bool = opt(False, "Overlap DP gradient reduce.", inert=_NO_OVERLAP)
    overlap_param_gather: bool = opt(False, "Overlap DP parameter gather.", inert=_NO_OVERLAP)
    distributed_backend: str = opt(
        "nccl",
        "Collective backend (nccl/hccl/gloo).",
        inert=megatron_reason(
            "the megatron engine picks the backend from the trainer's device: gloo on CPU, nccl on "
            "GPU, hccl on NPU",
            torch=TORCH_ONE_REPLICA,
        ),
    )


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
    use_rotary_position_embeddings: bool = opt(
        False,
        "Legacy RoPE switch.",
        inert="legacy switch: position_embedding_type (rope) chooses the positions in both engines",
    )
    use_flash_attn: bool = opt(
        False, "Flash attention (TransformerEngine on CUDA, MindSpeed on NPU).", inert_on_torch=MEGATRON_ONLY
    )
    use_fused_moe_token_permute_and_unpermute: bool = opt(
        False,
        "Fused MoE permute.",
        inert=megatron_reason("the megatron engine keeps megatron-core's unfused MoE token permutation"),
    )
    no_masked_softmax_fusion: bool = opt(
        False,
        "Disable fused masked softmax.",
        inert=megatron_reason(
            "the megatron engine always passes an explicit causal mask, so masked-softmax fusion is off"
        ),
    )
    no_bias_dropout_fusion: bool = opt(
        False, "Disable fused bias-dropout.", inert=megatron_reason(_FUSED_OFF + " (no bias, no dropout)")
    )
    no_rope_fusion: bool = opt(
        False,
        "Disable fused RoPE.",
        inert=megatron_reason("in the megatron engine use_fused_rotary_pos_emb alone decides RoPE fusion"),
    )
    attention_softmax_in_fp32: bool = opt(
        False,
        "Softmax in fp32 under bf16.",
        inert=megatron_reason("the megatron engine leaves it at megatron-core's default"),
    )
    no_gradient_accumulation_fusion: bool = opt(
        False, "Disable fused grad accum.", inert=megatron_reason(_FUSED_OFF)
    )
    gemm_gradient_accumulation_fusion: bool = opt(
        False, "Fused GEMM grad accum.", inert=megatron_reason(_FUSED_OFF)
    )
    reuse_fp32_param: bool = opt(
        False,
        "Share fp32 master weights memory.",
        inert=megatron_reason("the megatron engine keeps separate fp32 master weights (same results)"),
    )
    use_cpu_initialization: bool = opt(
        False,
        "Initialise weights on CPU.",
        inert=ByEngine(
            torch="the torch engine loads the HF folder as it is",
            megatron="the megatron engine always builds the model on the host uninitialised, then loads "
            "its slice of the HF weights",
        ),
    )
    use_mc2: bool = opt(
        False,
        "Ascend MC2 fused communication.",
        inert=megatron_reason("the megatron engine does not enable MindSpeed's MC2 (same results)"),
    )
    recompute_granularity: str | None = opt(None, "full or selective.", inert_on_torch=_RECOMPUTE)
    recompute_method: str | None = opt(None, "uniform or block (with full).", inert_on_torch=_RECOMPUTE)
    recompute_num_layers: int | None = opt(
        None, "Layers per recomputed chunk (full).", inert_on_torch=_RECOMPUTE
    )
    swap_attention: bool = opt(
        False,
        "Swap attention activations to host.",
        inert=megatron_reason(
            "the megatron engine keeps activations on the device (the recompute_* keys save memory)",
            torch=_RECOMPUTE,
        ),
    )
    no_shared_storage: bool = opt(
        False,
        "Nodes do not share a file system.",
        inert="checkpoints are written to one folder every rank must see (save on shared storage)",
    )
    load_checkpoint_loosely: bool = opt(
        False,
        "Allow missing keys on load.",
        inert="checkpoints load strictly: resuming a different setup is refused, naming what differs",
    )
    ckpt_format: str = opt(
        "torch",
        "Megatron checkpoint format.",
        inert=ByEngine(
            torch="the torch engine writes an HF folder and trainer_state.pt",
            megatron="the megatron engine writes megatron's dist_checkpointing (torch_dist) and an HF folder",
        ),
    )
    initial_loss_scale: float = opt(
        4294967296.0,
        "fp16 dynamic loss scale start.",
        inert="fp16 training is refused and bf16 needs no loss scaling",
    )
    accumulate_allreduce_grads_in_fp32: bool = opt(
        False,
        "Accumulate and all-reduce gradients in fp32 under bf16 (megatron's grad buffer).",
        inert_on_torch=MEGATRON_ONLY,
    )
