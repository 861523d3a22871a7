"""HF Qwen2.5 / Qwen3 / Qwen3-MoE checkpoints <-> megatron-core GPTModel shards.

Both layer specs the engine builds are mapped: the local one (CPU, NPU) and TransformerEngine's
(CUDA), whose names differ only in the norms fused into the next linear
(``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``) and in grouped experts
(TEGroupedMLP: ``mlp.experts.linear_fc1.weight<i>``, one tensor per local expert laid out like
SequentialMLP's ``local_experts.<i>.linear_fc1.weight``; megatron-core 0.12.1 and 0.19.2
``extensions/transformer_engine.py`` name them ``weight{gemm_idx}``).

Both directions are driven by the megatron parameter name, so the names always come from a real
``GPTModel.state_dict()``:

- load: :func:`megatron_shard` builds the tensor one rank holds for a megatron name, reading only
  the rows/columns of the HF tensors that rank needs (:class:`SafetensorsSource` slices on disk);
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

import json
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from mindspeed_rl.models.training.megatron.layout import SpecKind

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

    def check(self, dims: GPTDims) -> None:
        """Raise if ``dims`` does not split evenly over this layout."""
        needs = {
            f"num_query_groups={dims.num_query_groups} by tp": (dims.num_query_groups, self.tp_size),
            f"ffn_hidden_size={dims.ffn_hidden_size} by tp": (dims.ffn_hidden_size, self.tp_size),
            f"num_layers={dims.num_layers} by pp": (dims.num_layers, self.pp_size),
        }
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
        return self.pp_rank * (dims.num_layers // self.pp_size)

    def local_experts(self, dims: GPTDims) -> int:
        assert dims.num_experts is not None
        return dims.num_experts // self.ep_size


class TensorSource(Protocol):
    """Read-only access to HF tensors, optionally one contiguous range along a dim."""

    def read(self, name: str, *, dim: int = 0, start: int = 0, stop: int | None = None) -> torch.Tensor: ...


class DictSource:
    """A :class:`TensorSource` over in-memory tensors (an HF ``state_dict``)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._tensors = tensors

    def read(self, name: str, *, dim: int = 0, start: int = 0, stop: int | None = None) -> torch.Tensor:
        if name not in self._tensors:
            raise KeyError(f"{name} is not in the HF weights")
        t = self._tensors[name]
        end = t.shape[dim] if stop is None else stop
        return t.narrow(dim, start, end - start).clone()


class SafetensorsSource:
    """A :class:`TensorSource` over an HF folder: only the requested slice is read from disk."""

    def __init__(self, model_dir: str | os.PathLike[str]) -> None:
        from safetensors import safe_open

        folder = Path(model_dir)
        self._files: dict[str, Path] = {}
        for file in sorted(folder.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                    self._files[key] = file
        if not self._files:
            raise ValueError(f"{folder} holds no *.safetensors files; point the model path at an HF folder")

    def read(self, name: str, *, dim: int = 0, start: int = 0, stop: int | None = None) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self._files:
            raise KeyError(f"{name} is not in the HF weights")
        with safe_open(str(self._files[name]), framework="pt") as handle:
            piece = handle.get_slice(name)
            shape = piece.get_shape()
            end = shape[dim] if stop is None else stop
            index = tuple(slice(start, end) if d == dim else slice(None) for d in range(len(shape)))
            return piece[index].clone()


_LAYER = re.compile(r"decoder\.layers\.(?P<layer>\d+)\.(?P<rest>.+)")
_LOCAL_EXPERT = re.compile(r"mlp\.experts\.local_experts\.(\d+)\.(.+)")
_EXPERT = re.compile(r"mlp\.experts\.local_experts\.(?P<expert>\d+)\.(?P<fc>linear_fc[12])\.weight")
_GROUPED_EXPERT = re.compile(r"mlp\.experts\.(?P<fc>linear_fc[12])\.weight(?P<expert>\d+)")
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


def is_weight_name(name: str) -> bool:
    """Megatron state-dict entries that are not weights (``_extra_state``) are skipped."""
    return not name.endswith("_extra_state")


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


def _expert_match(rest: str) -> re.Match[str] | None:
    """An expert weight of either spec, with groups ``expert`` (local id) and ``fc``."""
    return _EXPERT.fullmatch(rest) or _GROUPED_EXPERT.fullmatch(rest)


def megatron_shard(name: str, dims: GPTDims, coords: ShardCoords, source: TensorSource) -> torch.Tensor:
    """The tensor this rank holds under megatron parameter ``name``, read from HF weights."""
    if name == "embedding.word_embeddings.weight":
        return _vocab_rows(source, "model.embed_tokens.weight", dims, coords)
    if name == "output_layer.weight":
        hf = "model.embed_tokens.weight" if dims.tied_embeddings else "lm_head.weight"
        return _vocab_rows(source, hf, dims, coords)
    if name == "decoder.final_layernorm.weight":
        return source.read("model.norm.weight")
    match = _LAYER.fullmatch(name)
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
    expert = _expert_match(rest)
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
    for layer in range(dims.num_layers // coords.pp_size):
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
    match = _LAYER.fullmatch(name)
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
    expert = _expert_match(rest)
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


def export_name(name: str, dims: GPTDims, coords: ShardCoords) -> str | None:
    """The snapshot name of one rank's megatron tensor (global layer and expert ids), or None
    for a tensor that is not exported."""
    if name == "output_layer.weight" and dims.tied_embeddings:
        return None
    match = _LAYER.fullmatch(name)
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
