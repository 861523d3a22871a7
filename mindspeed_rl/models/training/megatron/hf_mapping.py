"""HF Qwen2.5 / Qwen3 / Qwen3-MoE checkpoints <-> megatron-core GPTModel shards, tensor by tensor.

Both directions are driven by the megatron parameter name (``param_names``: the local and the
TransformerEngine spec's), so the names always come from a real ``GPTModel.state_dict()``:

- load: :func:`megatron_shard` builds the tensor one rank holds for a megatron name, reading only
  the rows/columns of the HF tensors that rank needs (``hf_sources``: a slice on disk);
- export: :func:`hf_pieces` turns one rank's tensor into HF-named pieces and :func:`assemble_hf`
  concatenates the pieces of every rank into full HF tensors.

Layout facts this encodes (megatron's attention and MLP code):

- fused QKV rows are laid out per query group: ``[q_g (heads_per_group x head_dim); k_g; v_g]``,
  and TP rank r holds groups ``[r * G/tp, (r + 1) * G/tp)``;
- ``linear_fc1`` on TP rank r is ``[gate_r; up_r]`` (each ``ffn/tp`` rows), not a slice of
  ``[gate; up]``: the halves must be split per rank before any TP merge;
- ``linear_proj`` and ``linear_fc2`` are row parallel (split along the input dim);
- vocab rows are padded to a multiple of ``make_vocab_size_divisible_by x tp`` and split by TP;
- MoE experts: EP rank e holds global experts ``[e * E/ep, (e + 1) * E/ep)`` as ``local_experts.i``;
  expert TP (etp) splits each expert like a dense MLP, independently of attention TP;
- PP stage s holds global layers ``[s * L/pp, (s + 1) * L/pp)`` under local indices from 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from mindspeed_rl.models.training.megatron.hf_sources import TensorSource
from mindspeed_rl.models.training.megatron.param_names import LAYER_NAME, expert_match
from mindspeed_rl.weights.megatron_dims import LAYER_COPIES, GPTDims, ShardCoords


def _chunk(size: int, parts: int, index: int) -> tuple[int, int]:
    step = size // parts
    return index * step, (index + 1) * step


def _vocab_rows(source: TensorSource, hf_name: str, dims: GPTDims, coords: ShardCoords) -> torch.Tensor:
    padded = dims.padded_vocab_size(coords.tp_size, coords.make_vocab_size_divisible_by)
    start, stop = _chunk(padded, coords.tp_size, coords.tp_rank)
    real_stop = min(stop, dims.vocab_size)
    out = torch.zeros(stop - start, dims.hidden_size)
    if real_stop > start:
        rows = source.read(hf_name, start=start, stop=real_stop)
        out = out.to(rows.dtype)
        out[: real_stop - start] = rows
    return out


def _qkv_rows(
    source: TensorSource, prefix: str, suffix: str, dims: GPTDims, coords: ShardCoords
) -> torch.Tensor:
    g0, g1 = _chunk(dims.num_query_groups, coords.tp_size, coords.tp_rank)
    hd, hpg = dims.head_dim, dims.heads_per_group
    q = source.read(f"{prefix}self_attn.q_proj.{suffix}", start=g0 * hpg * hd, stop=g1 * hpg * hd)
    k = source.read(f"{prefix}self_attn.k_proj.{suffix}", start=g0 * hd, stop=g1 * hd)
    v = source.read(f"{prefix}self_attn.v_proj.{suffix}", start=g0 * hd, stop=g1 * hd)
    groups = g1 - g0
    tail = q.shape[1:]
    blocks = [q.reshape(groups, hpg * hd, *tail), k.reshape(groups, hd, *tail), v.reshape(groups, hd, *tail)]
    return torch.cat(blocks, dim=1).reshape(groups * (hpg + 2) * hd, *tail)


def _mlp_shard(source: TensorSource, prefix: str, fc: str, ffn: int, parts: int, index: int) -> torch.Tensor:
    start, stop = _chunk(ffn, parts, index)
    if fc == "linear_fc1":
        gate = source.read(f"{prefix}gate_proj.weight", start=start, stop=stop)
        up = source.read(f"{prefix}up_proj.weight", start=start, stop=stop)
        return torch.cat([gate, up], dim=0)
    return source.read(f"{prefix}down_proj.weight", dim=1, start=start, stop=stop)


def megatron_shard(name: str, dims: GPTDims, coords: ShardCoords, source: TensorSource) -> torch.Tensor:
    """The tensor this rank holds under megatron parameter ``name``, read from HF weights."""
    if name == "embedding.word_embeddings.weight":
        return _vocab_rows(source, "model.embed_tokens.weight", dims, coords)
    if name == "output_layer.weight":
        hf = "model.embed_tokens.weight" if dims.tied_embeddings else "lm_head.weight"
        return _vocab_rows(source, hf, dims, coords)
    if name == "decoder.final_layernorm.weight":
        return source.read("model.norm.weight")
    match = LAYER_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"megatron parameter {name!r} has no HF mapping; extend hf_mapping for it")
    prefix = f"model.layers.{coords.layer_offset(dims) + int(match['layer'])}."
    rest = match["rest"]
    if rest in LAYER_COPIES:
        return source.read(prefix + LAYER_COPIES[rest])
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        return _qkv_rows(source, prefix, rest.rsplit(".", 1)[1], dims, coords)
    if rest == "self_attention.linear_proj.weight":
        h0, h1 = _chunk(dims.num_attention_heads, coords.tp_size, coords.tp_rank)
        return source.read(
            prefix + "self_attn.o_proj.weight", dim=1, start=h0 * dims.head_dim, stop=h1 * dims.head_dim
        )
    if rest in ("mlp.linear_fc1.weight", "mlp.linear_fc2.weight"):
        fc = rest.split(".")[1]
        return _mlp_shard(source, prefix + "mlp.", fc, dims.ffn_hidden_size, coords.tp_size, coords.tp_rank)
    expert = expert_match(rest)
    if expert is not None and dims.moe_ffn_hidden_size is not None:
        global_id = coords.ep_rank * coords.local_experts(dims) + int(expert["expert"])
        return _mlp_shard(
            source,
            f"{prefix}mlp.experts.{global_id}.",
            expert["fc"],
            dims.moe_ffn_hidden_size,
            coords.etp_size,
            coords.etp_rank,
        )
    raise ValueError(f"megatron parameter {name!r} has no HF mapping; extend hf_mapping for it")


@dataclass(frozen=True, slots=True, kw_only=True)
class HFPiece:
    """Part of an HF tensor: concatenated with its siblings along ``dim`` in ``index`` order.

    ``dim`` None: the tensor is whole (every rank holding a copy gives the same piece).
    """

    name: str
    tensor: torch.Tensor
    dim: int | None = None
    index: int = 0


def _split_qkv(tensor: torch.Tensor, prefix: str, suffix: str, dims: GPTDims, tp_rank: int) -> list[HFPiece]:
    hd, hpg = dims.head_dim, dims.heads_per_group
    tail = tensor.shape[1:]
    grouped = tensor.reshape(-1, (hpg + 2) * hd, *tail)
    q, k, v = torch.split(grouped, [hpg * hd, hd, hd], dim=1)
    return [
        HFPiece(
            name=f"{prefix}self_attn.{p}_proj.{suffix}", tensor=t.reshape(-1, *tail), dim=0, index=tp_rank
        )
        for p, t in (("q", q), ("k", k), ("v", v))
    ]


def _split_mlp(tensor: torch.Tensor, prefix: str, fc: str, index: int) -> list[HFPiece]:
    if fc == "linear_fc1":
        gate, up = torch.chunk(tensor, 2, dim=0)
        return [
            HFPiece(name=f"{prefix}gate_proj.weight", tensor=gate, dim=0, index=index),
            HFPiece(name=f"{prefix}up_proj.weight", tensor=up, dim=0, index=index),
        ]
    return [HFPiece(name=f"{prefix}down_proj.weight", tensor=tensor, dim=1, index=index)]


def hf_pieces(name: str, tensor: torch.Tensor, dims: GPTDims, coords: ShardCoords) -> list[HFPiece]:
    """The HF-named pieces of one rank's megatron tensor (inverse of :func:`megatron_shard`)."""
    if name == "embedding.word_embeddings.weight":
        return [HFPiece(name="model.embed_tokens.weight", tensor=tensor, dim=0, index=coords.tp_rank)]
    if name == "output_layer.weight":
        # Tied: the last stage's copy is the embedding's twin; the embedding is exported instead.
        if dims.tied_embeddings:
            return []
        return [HFPiece(name="lm_head.weight", tensor=tensor, dim=0, index=coords.tp_rank)]
    if name == "decoder.final_layernorm.weight":
        return [HFPiece(name="model.norm.weight", tensor=tensor)]
    match = LAYER_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"megatron parameter {name!r} has no HF mapping; extend hf_mapping for it")
    prefix = f"model.layers.{coords.layer_offset(dims) + int(match['layer'])}."
    rest = match["rest"]
    if rest in LAYER_COPIES:
        return [HFPiece(name=prefix + LAYER_COPIES[rest], tensor=tensor)]
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        return _split_qkv(tensor, prefix, rest.rsplit(".", 1)[1], dims, coords.tp_rank)
    if rest == "self_attention.linear_proj.weight":
        return [HFPiece(name=prefix + "self_attn.o_proj.weight", tensor=tensor, dim=1, index=coords.tp_rank)]
    if rest in ("mlp.linear_fc1.weight", "mlp.linear_fc2.weight"):
        return _split_mlp(tensor, prefix + "mlp.", rest.split(".")[1], coords.tp_rank)
    expert = expert_match(rest)
    if expert is not None and dims.is_moe:
        global_id = coords.ep_rank * coords.local_experts(dims) + int(expert["expert"])
        return _split_mlp(tensor, f"{prefix}mlp.experts.{global_id}.", expert["fc"], coords.etp_rank)
    raise ValueError(f"megatron parameter {name!r} has no HF mapping; extend hf_mapping for it")


def assemble_hf(pieces: Iterable[HFPiece], dims: GPTDims) -> dict[str, torch.Tensor]:
    """Full HF tensors from the pieces of every rank; vocab padding trimmed."""
    grouped: dict[str, list[HFPiece]] = defaultdict(list)
    for piece in pieces:
        grouped[piece.name].append(piece)
    out: dict[str, torch.Tensor] = {}
    for name, group in grouped.items():
        dim = group[0].dim
        if any(p.dim != dim for p in group):
            raise ValueError(
                f"{name}: pieces disagree on their concat dim; the shards come from mixed layouts"
            )
        if dim is None:
            out[name] = group[0].tensor
            continue
        by_index = {p.index: p.tensor for p in group}
        if sorted(by_index) != list(range(len(by_index))):
            raise ValueError(f"{name}: pieces from ranks {sorted(by_index)}; a rank's shard is missing")
        out[name] = torch.cat([by_index[i] for i in range(len(by_index))], dim=dim)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in out:
            out[name] = out[name][: dims.vocab_size].contiguous()
    return out
