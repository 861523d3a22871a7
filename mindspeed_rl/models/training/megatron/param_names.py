"""Megatron-core GPTModel parameter names: which a rank's stage holds, and their snapshot names.

Both layer specs the engine builds are named here: the local one (CPU, NPU) and
TransformerEngine's (CUDA), whose names differ only in the norms fused into the next linear
(``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``) and in grouped experts
(TEGroupedMLP: ``mlp.experts.linear_fc1.weight<i>``, one tensor per local expert laid out like
SequentialMLP's ``local_experts.<i>.linear_fc1.weight``; megatron-core 0.12.1 and 0.19.2
``extensions/transformer_engine.py`` name them ``weight{gemm_idx}``).

A snapshot names a rank's tensors globally (:func:`export_name`: global layer and expert ids, one
name whatever the spec), so its names do not depend on the PP stage, the EP rank or the spec. The
per-tensor HF rules on these names are ``hf_mapping``'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from mindspeed_rl.models.training.megatron.layout import SpecKind
from mindspeed_rl.weights.megatron_dims import GPTDims, ShardCoords

LAYER_NAME = re.compile(r"decoder\.layers\.(?P<layer>\d+)\.(?P<rest>.+)")
_LOCAL_EXPERT = re.compile(r"mlp\.experts\.local_experts\.(\d+)\.(.+)")
_EXPERT = re.compile(r"mlp\.experts\.local_experts\.(?P<expert>\d+)\.(?P<fc>linear_fc[12])\.weight")
_GROUPED_EXPERT = re.compile(r"mlp\.experts\.(?P<fc>linear_fc[12])\.weight(?P<expert>\d+)")


def is_weight_name(name: str) -> bool:
    """Megatron state-dict entries that are not weights (``_extra_state``) are skipped."""
    return not name.endswith("_extra_state")


def expert_match(rest: str) -> re.Match[str] | None:
    """An expert weight of either spec, with groups ``expert`` (local id) and ``fc``."""
    return _EXPERT.fullmatch(rest) or _GROUPED_EXPERT.fullmatch(rest)


def megatron_names(dims: GPTDims, coords: ShardCoords, *, spec: SpecKind = "local") -> list[str]:
    """The weight names of this rank's GPTModel stage, ``_extra_state`` excluded.

    What a snapshot manifest promises per rank; the gloo tests check the local spec's against the
    real ``GPTModel.state_dict()`` of every layout. The TransformerEngine spec's (``spec``, grouped
    experts as the engine builds it on CUDA) follow megatron's TE spec and were not checked
    against a TE build (no CUDA here).
    """
    te = spec == "transformer_engine"
    first, last = coords.pp_rank == 0, coords.pp_rank == coords.pp_size - 1
    names = ["embedding.word_embeddings.weight"] if first else []
    for layer in range(coords.stage_num_layers(dims)):
        p = f"decoder.layers.{layer}."
        qkv = p + "self_attention.linear_qkv."
        names += [qkv + "layer_norm_weight"] if te else [p + "input_layernorm.weight"]
        names.append(qkv + "weight")
        if dims.qkv_bias:
            names.append(qkv + "bias")
        names.append(p + "self_attention.linear_proj.weight")
        if dims.qk_layernorm:
            names += [p + "self_attention.q_layernorm.weight", p + "self_attention.k_layernorm.weight"]
        if dims.is_moe:
            # MoE layers keep a separate pre-MLP norm in both specs (the router reads its output).
            names += [p + "pre_mlp_layernorm.weight", p + "mlp.router.weight"]
            for e in range(coords.local_experts(dims)):
                if te:
                    names += [f"{p}mlp.experts.linear_fc{i}.weight{e}" for i in (1, 2)]
                else:
                    names += [f"{p}mlp.experts.local_experts.{e}.linear_fc{i}.weight" for i in (1, 2)]
        else:
            names += [p + "mlp.linear_fc1.layer_norm_weight"] if te else [p + "pre_mlp_layernorm.weight"]
            names += [p + "mlp.linear_fc1.weight", p + "mlp.linear_fc2.weight"]
    if last:
        names.append("decoder.final_layernorm.weight")
        # Tied embeddings: a single stage reuses the embedding; a last stage keeps its own copy.
        if not dims.tied_embeddings or not first:
            names.append("output_layer.weight")
    return names


def export_name(name: str, dims: GPTDims, coords: ShardCoords) -> str | None:
    """The snapshot name of one rank's megatron tensor (global layer and expert ids), or None
    for a tensor that is not exported."""
    if name == "output_layer.weight" and dims.tied_embeddings:
        return None
    match = LAYER_NAME.fullmatch(name)
    if match is None:
        return name
    layer = coords.layer_offset(dims) + int(match["layer"])
    rest = match["rest"]
    expert = _LOCAL_EXPERT.fullmatch(rest)
    if expert is not None:
        rest = f"mlp.experts.{coords.ep_rank * coords.local_experts(dims) + int(expert[1])}.{expert[2]}"
    grouped = _GROUPED_EXPERT.fullmatch(rest)
    if grouped is not None:
        # The same global name as SequentialMLP's: snapshots do not depend on the spec.
        global_id = coords.ep_rank * coords.local_experts(dims) + int(grouped["expert"])
        rest = f"mlp.experts.{global_id}.{grouped['fc']}.weight"
    return f"decoder.layers.{layer}.{rest}"


def export_shard(
    state: Mapping[str, torch.Tensor], dims: GPTDims, coords: ShardCoords
) -> dict[str, torch.Tensor]:
    """This rank's tensors under their snapshot names (``_extra_state`` and tied copies dropped)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if not is_weight_name(name) or not isinstance(tensor, torch.Tensor):
            continue
        exported = export_name(name, dims, coords)
        if exported is not None:
            out[exported] = tensor
    return out
