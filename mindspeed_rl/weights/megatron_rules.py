"""Megatron-core snapshots in the weight flow: export names, partition rules, unfuse + rename to HF.

What one training rank exports and what the GU's convert does with it::

    rank (tp, ep, pp): GPTModel.state_dict() ──hf_mapping.export_shard──► global megatron names, this rank's shapes
        decoder.layers.<local>          -> decoder.layers.<pp offset + local>
        mlp.experts.local_experts.<i>   -> mlp.experts.<ep_rank x E/ep + i>   (one EP rank owns it)
        output_layer (tied, last stage) -> not exported (the embedding is the weight)
    GU convert: pieces ──unfuse per TP piece (QKV per query group, fc1 [gate; up])──► rename to HF
        ──► merge TP (training_rules' tp_dim) and EP (ep_local experts) ──► trim_vocab_padding

Global names make every tensor live on exactly one PP stage, which is what ``merge_pieces``
requires. Torch is only needed for the tensors themselves; the rules are plain data.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping

import torch

from mindspeed_rl.weights.layout import PartitionRule, PartitionSpec, RankCoords, TrainingLayout
from mindspeed_rl.weights.megatron_dims import LAYER_COPIES, GPTDims, ShardCoords
from mindspeed_rl.weights.merge import NameMap, UnfuseRule

_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")
SCHEME = "megatron"
"""``TrainingLayout.naming["scheme"]`` of a megatron snapshot."""
Finalize = Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]


def rank_coords(coords: ShardCoords) -> RankCoords:
    return RankCoords(tp_rank=coords.tp_rank, ep_rank=coords.ep_rank, pp_rank=coords.pp_rank)


def training_rules(*, expert_tensor_parallel_size: int = 1) -> tuple[PartitionRule, ...]:
    """How each exported megatron tensor is split (column parallel: dim 0, row parallel: dim 1)."""
    column, row = PartitionSpec(tp_dim=0), PartitionSpec(tp_dim=1)
    split_experts = expert_tensor_parallel_size > 1
    return (
        PartitionRule(
            pattern=r"\.mlp\.experts\.(?P<expert>\d+)\.linear_fc1\.weight$",
            spec=PartitionSpec(tp_dim=0 if split_experts else None, ep_local=True),
        ),
        PartitionRule(
            pattern=r"\.mlp\.experts\.(?P<expert>\d+)\.linear_fc2\.weight$",
            spec=PartitionSpec(tp_dim=1 if split_experts else None, ep_local=True),
        ),
        PartitionRule(pattern=r"\.self_attention\.linear_qkv\.(weight|bias)$", spec=column),
        PartitionRule(pattern=r"\.mlp\.linear_fc1\.weight$", spec=column),
        PartitionRule(pattern=r"\.(self_attention\.linear_proj|mlp\.linear_fc2)\.weight$", spec=row),
        PartitionRule(pattern=r"^(embedding\.word_embeddings|output_layer)\.weight$", spec=column),
    )


def training_layout(
    *,
    tp_size: int,
    pp_size: int,
    ep_size: int,
    expert_tensor_parallel_size: int = 1,
    dims: GPTDims | None = None,
) -> TrainingLayout:
    """The manifest layout of a megatron snapshot. Expert TP must be 1 or the attention TP: the
    merge splits every TP-partitioned tensor over the same ``tp_size`` ranks. With ``dims`` the
    layout also records the naming scheme, so a GU converts the snapshot from its manifest alone
    (``convert_steps``) without being told which backend wrote it."""
    if expert_tensor_parallel_size not in (1, tp_size):
        raise ValueError(
            f"expert_tensor_parallel_size={expert_tensor_parallel_size} with tensor_model_parallel_size={tp_size}: "
            "snapshots merge experts at expert TP 1 or equal to TP; set actor_config.expert_tensor_parallel_size"
        )
    naming = None
    if dims is not None:
        naming = {
            "scheme": SCHEME,
            "dims": dataclasses.asdict(dims),
            "expert_tensor_parallel_size": expert_tensor_parallel_size,
        }
    return TrainingLayout(
        tp_size=tp_size,
        pp_size=pp_size,
        ep_size=ep_size,
        rules=training_rules(expert_tensor_parallel_size=expert_tensor_parallel_size),
        naming=naming,
    )


def convert_steps(layout: TrainingLayout) -> tuple[NameMap, Finalize]:
    """The name map (unfuse + rename) and the after-merge step (vocab-padding trim) that a
    megatron snapshot's manifest layout asks for."""
    naming = layout.naming
    if naming is None or naming.get("scheme") != SCHEME:
        raise ValueError(
            f"layout naming {naming!r} is not a megatron snapshot's; build it with training_layout(dims=...)"
        )
    dims = GPTDims(**naming["dims"])
    etp = int(naming["expert_tensor_parallel_size"])
    rules = name_map(dims, tp_size=layout.tp_size, expert_tensor_parallel_size=etp)
    return rules, functools.partial(trim_vocab_padding, dims=dims)


def unfuse_rules(
    dims: GPTDims, *, tp_size: int, expert_tensor_parallel_size: int = 1
) -> tuple[UnfuseRule, ...]:
    """Split fused tensors per TP piece: QKV into per-group ``[q_g; k_g; v_g]``, fc1 into ``[gate; up]``."""
    hd, hpg = dims.head_dim, dims.heads_per_group
    layer = r"decoder\.layers\.(\d+)\."
    rules = [
        UnfuseRule(
            pattern=layer + r"self_attention\.linear_qkv\.(weight|bias)",
            outputs=tuple(rf"decoder.layers.\g<1>.self_attention.linear_{p}.\g<2>" for p in "qkv"),
            block_sizes=(hpg * hd, hd, hd),
        )
    ]
    if dims.moe_ffn_hidden_size is not None:
        half = dims.moe_ffn_hidden_size // expert_tensor_parallel_size
        rules.append(
            UnfuseRule(
                pattern=layer + r"mlp\.experts\.(\d+)\.linear_fc1\.weight",
                outputs=tuple(
                    rf"decoder.layers.\g<1>.mlp.experts.\g<2>.linear_{p}.weight" for p in ("gate", "up")
                ),
                # One block, not repeats: [gate; up] is one (etp-)piece of one expert.
                block_sizes=(half, half),
            )
        )
    else:
        half = dims.ffn_hidden_size // tp_size
        rules.append(
            UnfuseRule(
                pattern=layer + r"mlp\.linear_fc1\.weight",
                outputs=tuple(rf"decoder.layers.\g<1>.mlp.linear_{p}.weight" for p in ("gate", "up")),
                block_sizes=(half, half),
            )
        )
    return tuple(rules)


_TOP_LEVEL = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "output_layer.weight": "lm_head.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
}
_UNFUSED = {
    "self_attention.linear_q": "self_attn.q_proj",
    "self_attention.linear_k": "self_attn.k_proj",
    "self_attention.linear_v": "self_attn.v_proj",
    "self_attention.linear_proj": "self_attn.o_proj",
    "mlp.linear_gate": "mlp.gate_proj",
    "mlp.linear_up": "mlp.up_proj",
    "mlp.linear_fc2": "mlp.down_proj",
}
_EXPERT_PART = re.compile(r"mlp\.experts\.(\d+)\.linear_(gate|up|fc2)\.weight")


def hf_name(name: str) -> str:
    """HF name of an exported (and unfused) megatron tensor."""
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    match = _LAYER.fullmatch(name)
    if match is not None:
        prefix, rest = f"model.layers.{match[1]}.", match[2]
        if rest in LAYER_COPIES:
            return prefix + LAYER_COPIES[rest]
        module, _, suffix = rest.rpartition(".")
        if module in _UNFUSED:
            return f"{prefix}{_UNFUSED[module]}.{suffix}"
        expert = _EXPERT_PART.fullmatch(rest)
        if expert is not None:
            proj = {"gate": "gate_proj", "up": "up_proj", "fc2": "down_proj"}[expert[2]]
            return f"{prefix}mlp.experts.{expert[1]}.{proj}.weight"
    raise ValueError(f"snapshot tensor {name!r} has no HF name; extend megatron_rules.hf_name for it")


def name_map(dims: GPTDims, *, tp_size: int, expert_tensor_parallel_size: int = 1) -> NameMap:
    """What the GU's convert applies to a megatron snapshot before merging."""
    return NameMap(
        rename=hf_name,
        unfuse=unfuse_rules(dims, tp_size=tp_size, expert_tensor_parallel_size=expert_tensor_parallel_size),
    )


def trim_vocab_padding(full: Mapping[str, torch.Tensor], dims: GPTDims) -> dict[str, torch.Tensor]:
    """Drop megatron's padded vocabulary rows after the TP merge (HF has exactly ``vocab_size``)."""
    out = dict(full)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in out:
            out[name] = out[name][: dims.vocab_size].contiguous()
    return out
