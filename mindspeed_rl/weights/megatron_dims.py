"""What an HF checkpoint's architecture is (:class:`GPTDims`, read from ``config.json``) and where
one rank sits in the training layout (:class:`ShardCoords`), and which per-layer tensors are
copies of one HF tensor (``LAYER_COPIES``).

The facts every rule between HF checkpoints and megatron-core shards is computed from (the snapshot
rules in ``weights.megatron_rules``; the names in ``models/training/megatron/param_names``, the
tensors in ``hf_mapping``), and all the model builder takes from the checkpoint's config. They live
in the weight-format library, below the engines that use them; plain data, without torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Family = Literal["qwen2", "qwen3", "qwen3_moe"]
_FAMILIES: tuple[Family, ...] = ("qwen2", "qwen3", "qwen3_moe")


@dataclass(frozen=True, slots=True, kw_only=True)
class GPTDims:
    """The architecture of an HF checkpoint, in the terms the megatron model is built from."""

    family: Family
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    norm_epsilon: float
    tied_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool
    pad_token_id: int | None = None
    """HF embeds with ``padding_idx=pad_token_id``: that row gets no gradient from lookups."""
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_topk: int | None = None
    norm_topk_prob: bool = False

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    def padded_vocab_size(self, tp_size: int, divisible_by: int = 128) -> int:
        """Megatron's padded vocabulary: a multiple of ``divisible_by x tp_size``."""
        step = divisible_by * tp_size
        return -(-self.vocab_size // step) * step


def _rope_theta(config: Mapping[str, Any]) -> float:
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type != "default":
        raise ValueError(
            f"rope type {rope_type!r} is not mapped to megatron yet; only plain RoPE checkpoints load "
            "into the megatron backend (use the torch engine for this model)"
        )
    return float(params.get("rope_theta", config.get("rope_theta", 10000.0)))


def dims_from_hf_config(config: Mapping[str, Any]) -> GPTDims:
    """Read ``config.json`` of a Qwen2/Qwen2.5, Qwen3 or Qwen3-MoE checkpoint."""
    family = config.get("model_type")
    if family not in _FAMILIES:
        raise ValueError(
            f"model_type {family!r} has no HF<->megatron mapping; supported: {list(_FAMILIES)} "
            "(use the torch engine, megatron_training.use_mcore_models: false, for other models)"
        )
    if config.get("use_sliding_window"):
        raise ValueError("use_sliding_window: true is not mapped to megatron; set it false in config.json")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    moe: dict[str, Any] = {}
    if family == "qwen3_moe":
        if int(config.get("decoder_sparse_step", 1)) != 1 or config.get("mlp_only_layers"):
            raise ValueError(
                "Qwen3-MoE with dense layers (decoder_sparse_step != 1 or mlp_only_layers) is not mapped; "
                "every layer must be a MoE layer"
            )
        moe = {
            "num_experts": int(config.get("num_experts", config.get("num_local_experts", 0))),
            "moe_ffn_hidden_size": int(config["moe_intermediate_size"]),
            "moe_topk": int(config["num_experts_per_tok"]),
            "norm_topk_prob": bool(config.get("norm_topk_prob", False)),
        }
    return GPTDims(
        family=family,
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(config["intermediate_size"]),
        num_attention_heads=heads,
        num_query_groups=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        rope_theta=_rope_theta(config),
        norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        # Qwen2 hard-wires bias on q/k/v; Qwen3 reads attention_bias.
        qkv_bias=family == "qwen2" or bool(config.get("attention_bias", False)),
        qk_layernorm=family != "qwen2",
        pad_token_id=None if config.get("pad_token_id") is None else int(config["pad_token_id"]),
        **moe,
    )


def load_dims(model_dir: str | os.PathLike[str]) -> GPTDims:
    return dims_from_hf_config(json.loads((Path(model_dir) / "config.json").read_text()))


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardCoords:
    """Where one rank sits in the training layout (etp = expert tensor parallel)."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1
    etp_rank: int = 0
    etp_size: int = 1
    make_vocab_size_divisible_by: int = 128
    stage_layers: tuple[int, ...] = ()
    """Real layers of every pipeline stage when they are uneven (upstream's num_layer_list, noop
    layers left out); () = num_layers / pp_size each."""

    def check(self, dims: GPTDims) -> None:
        """Raise if ``dims`` does not split over this layout."""
        needs = {
            f"num_query_groups={dims.num_query_groups} by tp": (dims.num_query_groups, self.tp_size),
            f"ffn_hidden_size={dims.ffn_hidden_size} by tp": (dims.ffn_hidden_size, self.tp_size),
        }
        if not self.stage_layers:
            needs[f"num_layers={dims.num_layers} by pp"] = (dims.num_layers, self.pp_size)
        elif len(self.stage_layers) != self.pp_size or sum(self.stage_layers) != dims.num_layers:
            raise ValueError(
                f"the pipeline stages hold {list(self.stage_layers)} real layers ({sum(self.stage_layers)} in "
                f"all, over {len(self.stage_layers)} stages) but the model has {dims.num_layers} layers over "
                f"{self.pp_size} stages; make actor_config.num_layer_list (minus noop_layers) sum to the "
                "model's layer count"
            )
        if dims.is_moe:
            assert dims.num_experts is not None and dims.moe_ffn_hidden_size is not None
            needs[f"num_experts={dims.num_experts} by ep"] = (dims.num_experts, self.ep_size)
            needs[f"moe_ffn_hidden_size={dims.moe_ffn_hidden_size} by etp"] = (
                dims.moe_ffn_hidden_size,
                self.etp_size,
            )
        bad = [label for label, (n, d) in needs.items() if n % d]
        if bad:
            raise ValueError(
                f"the model does not split over this layout: {', '.join(bad)} is not exact; choose "
                "actor_config tensor/pipeline/expert parallel sizes that divide these"
            )

    def layer_offset(self, dims: GPTDims) -> int:
        """The model layer (HF index) of this stage's first layer."""
        if self.stage_layers:
            return sum(self.stage_layers[: self.pp_rank])
        return self.pp_rank * (dims.num_layers // self.pp_size)

    def stage_num_layers(self, dims: GPTDims) -> int:
        """Layers this rank's pipeline stage holds."""
        if self.stage_layers:
            return self.stage_layers[self.pp_rank]
        return dims.num_layers // self.pp_size

    def local_experts(self, dims: GPTDims) -> int:
        assert dims.num_experts is not None
        return dims.num_experts // self.ep_size


# Replicated per-layer tensors: megatron suffix -> HF suffix. The TE-spec names (layer norm fused
# into the next linear) are listed too so checkpoints of accelerator runs map the same way.
LAYER_COPIES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "mlp.router.weight": "mlp.gate.weight",
}
