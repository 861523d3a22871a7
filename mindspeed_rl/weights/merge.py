"""Tensor-level resharding: unfuse, rename, merge training shards, split for inference ranks.

The order matters and is the reason this is a pipeline of per-piece steps:

    training piece (one rank's slice) ─► unfuse (per piece!) ─► rename ─► merge TP, then EP ─► split for GU rank

Unfusing must happen per TP piece, before the TP merge: Megatron's fused
``linear_fc1`` on TP rank r holds ``[gate_r; up_r]``, so concatenating the
ranks first would interleave gate and up rows. Likewise fused QKV holds, per
rank, repeating query-group blocks ``[q_g (heads_per_group*head_dim); k_g; v_g]``.
Both are expressed by one generic rule (`UnfuseRule`); see `megatron_unfuse_rules`.

A merge is planned from shapes before any byte moves (`plan_merge`: where each piece lands in
the merged tensor, every consistency check included). Every step here also runs on meta
tensors, which is how the GU's converter lays out its output files and checks the whole
conversion before reading a byte, then fills the merged tensors one piece at a time (convert.py).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from mindspeed_rl.weights.hostcopy import copy_into, copy_tensor
from mindspeed_rl.weights.layout import InferenceLayout, PartitionSpec, RankCoords
from mindspeed_rl.weights.manifest import SnapshotError


@dataclass(frozen=True, slots=True)
class Piece:
    """One rank's slice of a tensor as stored in a training snapshot."""

    name: str
    tensor: torch.Tensor
    spec: PartitionSpec
    coords: RankCoords


@dataclass(frozen=True, slots=True, kw_only=True)
class UnfuseRule:
    """Split a fused tensor (matched by ``re.fullmatch(pattern, name)``) into named parts.

    Along ``dim`` the piece is a repetition of blocks ``[part_0 | part_1 | ...]``
    with sizes ``block_sizes``; part k of the output is block k of every repeat,
    concatenated. ``outputs`` are `re.Match.expand` templates (``\\g<1>`` etc.).
    The parts keep the fused tensor's partition spec.
    """

    pattern: str
    outputs: tuple[str, ...]
    block_sizes: tuple[int, ...]
    dim: int = 0

    def __post_init__(self) -> None:
        if len(self.outputs) != len(self.block_sizes) or not self.outputs:
            raise ValueError(
                f"UnfuseRule {self.pattern!r}: {len(self.outputs)} outputs but {len(self.block_sizes)} "
                "block sizes; give one block size per output name"
            )


def _identity(name: str) -> str:
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class NameMap:
    """Training-name → inference-name mapping applied during conversion.

    On the torch backend both are HF names: identity, no unfusing. For a
    Megatron backend pass ``rename`` (e.g. ``decoder.layers.3.self_attention.linear_proj.weight``
    → ``model.layers.3.self_attn.o_proj.weight``) and ``unfuse`` rules for
    fused tensors (see `megatron_unfuse_rules`); rename is applied to the
    unfused part names.
    """

    rename: Callable[[str], str] = _identity
    unfuse: tuple[UnfuseRule, ...] = field(default_factory=tuple)


def unfuse_piece(piece: Piece, rules: Sequence[UnfuseRule]) -> list[Piece]:
    for rule in rules:
        match = re.fullmatch(rule.pattern, piece.name)
        if match is None:
            continue
        block = sum(rule.block_sizes)
        length = piece.tensor.shape[rule.dim]
        if length % block:
            raise SnapshotError(
                f"{piece.name}: size {length} along dim {rule.dim} is not a multiple of the unfuse block "
                f"{rule.block_sizes}; fix the UnfuseRule sizes for this layout's TP size"
            )
        t = piece.tensor
        shape = tuple(t.shape)
        blocks = t.reshape(*shape[: rule.dim], length // block, block, *shape[rule.dim + 1 :])
        parts = torch.split(blocks, list(rule.block_sizes), dim=rule.dim + 1)
        return [
            Piece(
                name=match.expand(template),
                tensor=part.reshape(*shape[: rule.dim], -1, *shape[rule.dim + 1 :]).contiguous(),
                spec=piece.spec,
                coords=piece.coords,
            )
            for template, part in zip(rule.outputs, parts, strict=True)
        ]
    return [piece]


def apply_name_map(pieces: Iterable[Piece], name_map: NameMap) -> list[Piece]:
    out: list[Piece] = []
    for piece in pieces:
        for part in unfuse_piece(piece, name_map.unfuse):
            out.append(
                Piece(name=name_map.rename(part.name), tensor=part.tensor, spec=part.spec, coords=part.coords)
            )
    return out


def merge_pieces(pieces: Iterable[Piece], *, tp_size: int, ep_size: int) -> dict[str, torch.Tensor]:
    """Rebuild full tensors: concatenate TP slices along ``tp_dim``, then EP slices along ``ep_dim``."""
    by_name: dict[str, list[Piece]] = defaultdict(list)
    for piece in pieces:
        by_name[piece.name].append(piece)
    return {
        name: assemble(plan_merge(name, group, tp_size, ep_size), group) for name, group in by_name.items()
    }


@dataclass(frozen=True, slots=True)
class MergePlan:
    """Where each piece of one tensor lands in the merged tensor.

    ``places[i]`` is the index (one slice per dim) of piece ``i`` of the group the plan was
    made from. Computed from shapes alone (meta pieces will do), so a converter can allocate
    the merged tensor first and fill it piece by piece as pieces are read.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    places: tuple[tuple[slice, ...], ...]

    @property
    def single(self) -> bool:
        """One piece is the whole tensor (replicated, or not split): it needs no copy."""
        return len(self.places) == 1

    def empty(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype)


def assemble(plan: MergePlan, group: Sequence[Piece]) -> torch.Tensor:
    """The merged tensor of ``plan`` from its pieces (the group the plan was made from)."""
    if plan.single:
        return group[0].tensor
    out = plan.empty()
    for piece, index in zip(group, plan.places, strict=True):
        copy_into(out[index], piece.tensor)
    return out


def plan_merge(name: str, group: Sequence[Piece], tp_size: int, ep_size: int) -> MergePlan:
    """Check that ``group`` (every piece of ``name``) merges, and plan where each piece goes."""
    specs = {p.spec for p in group}
    stages = {p.coords.pp_rank for p in group}
    dtypes = {p.tensor.dtype for p in group}
    if len(specs) != 1:
        raise SnapshotError(f"{name}: shards disagree on its partition ({specs}); re-export with one layout")
    if len(stages) != 1:
        raise SnapshotError(
            f"{name}: present on pipeline stages {sorted(stages)}; a name must live on one stage"
        )
    if len(dtypes) != 1:
        raise SnapshotError(
            f"{name}: shards hold it as {sorted(map(str, dtypes))}; re-export with one dtype per tensor"
        )
    spec = group[0].spec
    by_ep: dict[int, list[int]] = defaultdict(list)
    for i, piece in enumerate(group):
        by_ep[piece.coords.ep_rank].append(i)
    if spec.ep_dim is None:
        if len(by_ep) != 1:
            raise SnapshotError(f"{name}: not EP-split but written by EP ranks {sorted(by_ep)}")
        shape, places = _plan_tp(name, group, next(iter(by_ep.values())), spec, tp_size)
    else:
        _require_ranks(name, "EP", set(by_ep), ep_size)
        shape, places = _concat(
            name, [_plan_tp(name, group, by_ep[r], spec, tp_size) for r in range(ep_size)], spec.ep_dim
        )
    ordered = tuple(places[i] for i in range(len(group)))
    return MergePlan(name=name, shape=shape, dtype=group[0].tensor.dtype, places=ordered)


# (shape, {piece index: its index in that shape}); per dim a slice, so nesting only shifts one dim
_Placed = tuple[tuple[int, ...], dict[int, tuple[slice, ...]]]


def _plan_tp(
    name: str, group: Sequence[Piece], members: list[int], spec: PartitionSpec, tp_size: int
) -> _Placed:
    if spec.tp_dim is None:
        if len(members) != 1:
            raise SnapshotError(f"{name}: replicated over TP but {len(members)} copies were written")
        return _whole(group[members[0]], members[0])
    ranks = [group[i].coords.tp_rank for i in members]
    if len(ranks) != len(set(ranks)):
        raise SnapshotError(f"{name}: TP ranks {sorted(ranks)} contain duplicates")
    _require_ranks(name, "TP", set(ranks), tp_size)
    ordered = sorted(members, key=lambda i: group[i].coords.tp_rank)
    return _concat(name, [_whole(group[i], i) for i in ordered], spec.tp_dim)


def _whole(piece: Piece, index: int) -> _Placed:
    shape = tuple(piece.tensor.shape)
    return shape, {index: tuple(slice(0, n) for n in shape)}


def _concat(name: str, parts: list[_Placed], dim: int) -> _Placed:
    """Lay ``parts`` end to end along ``dim``; every other dim must agree (as for a concatenation)."""
    if len(parts) == 1:
        return parts[0]
    shapes = [shape for shape, _ in parts]
    rest = {shape[:dim] + shape[dim + 1 :] for shape in shapes}
    if any(len(shape) <= dim for shape in shapes) or len(rest) != 1:
        raise SnapshotError(
            f"{name}: pieces of shapes {[list(s) for s in shapes]} cannot be joined along dim {dim}; "
            "the shards were exported with different model shapes or partition rules"
        )
    places: dict[int, tuple[slice, ...]] = {}
    offset = 0
    for shape, members in parts:
        for i, index in members.items():
            shifted = index[dim]
            places[i] = (
                *index[:dim],
                slice(shifted.start + offset, shifted.stop + offset),
                *index[dim + 1 :],
            )
        offset += shape[dim]
    total = (*shapes[0][:dim], offset, *shapes[0][dim + 1 :])
    return total, places


def _require_ranks(name: str, axis: str, present: set[int], size: int) -> None:
    if present != set(range(size)):
        raise SnapshotError(f"{name}: {axis} slices from ranks {sorted(present)}, expected 0..{size - 1}")


def split_for_rank(
    full: Mapping[str, torch.Tensor],
    layout: InferenceLayout,
    rank: int,
    *,
    owners: Mapping[str, int] | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors inference rank ``rank`` holds: TP/EP slices, and only its own experts.

    ``owners`` (`expert_owners` of the whole model) lets a caller split part of the model at a
    time: which EP rank owns an expert depends on every expert id, not only those in ``full``.
    """
    coords = layout.coords(rank)
    if layout.world_size == 1:
        return dict(full)
    if owners is None:
        owners = expert_owners(full, layout)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in full.items():
        spec = layout.spec_for(name)
        if spec.ep_local and owners[name] != coords.ep_rank:
            continue  # another EP rank's expert, by design
        t = tensor
        if spec.ep_dim is not None:
            t = _chunk(name, t, spec.ep_dim, layout.ep_size, coords.ep_rank)
        if spec.tp_dim is not None:
            t = _chunk(name, t, spec.tp_dim, layout.tp_size, coords.tp_rank)
        out[name] = t
    return out


def _chunk(name: str, tensor: torch.Tensor, dim: int, parts: int, index: int) -> torch.Tensor:
    length = tensor.shape[dim]
    if length % parts:
        raise ValueError(
            f"{name}: size {length} along dim {dim} does not divide into {parts} inference ranks; "
            "choose an inference TP/EP size that divides it"
        )
    step = length // parts
    return copy_tensor(tensor.narrow(dim, index * step, step))


def expert_owners(names: Iterable[str], layout: InferenceLayout) -> dict[str, int]:
    """EP rank owning each ``ep_local`` tensor: experts sorted by id, dealt in equal contiguous runs."""
    ids: dict[str, int] = {}
    for name in names:
        rule = layout.rule_for(name)
        if rule is not None and rule.spec.ep_local:
            match = re.search(rule.pattern, name)
            assert match is not None
            ids[name] = int(match.group("expert"))
    experts = sorted(set(ids.values()))
    if len(experts) % layout.ep_size:
        raise ValueError(
            f"{len(experts)} experts cannot be dealt evenly to inference ep_size={layout.ep_size}; "
            "choose an EP size that divides the number of experts"
        )
    per_rank = len(experts) // max(1, layout.ep_size)
    position = {expert: i for i, expert in enumerate(experts)}
    return {name: position[e] // per_rank for name, e in ids.items()}


def megatron_unfuse_rules(
    *, num_query_groups: int, heads_per_group: int, head_dim: int, ffn_hidden_size: int, tp_size: int
) -> tuple[UnfuseRule, ...]:
    """Unfuse rules for Megatron GPT layers (fused QKV and SwiGLU fc1), on Megatron names.

    Combine with a ``rename`` that maps the remaining Megatron names to HF.
    Sizes are per TP piece, hence the ``tp_size`` argument.
    """
    if num_query_groups % tp_size or ffn_hidden_size % tp_size:
        raise ValueError(
            f"num_query_groups={num_query_groups} and ffn_hidden_size={ffn_hidden_size} must both be "
            f"divisible by tp_size={tp_size}"
        )
    prefix = r"decoder\.layers\.(\d+)\."
    ffn = ffn_hidden_size // tp_size
    qkv = (heads_per_group * head_dim, head_dim, head_dim)
    return (
        UnfuseRule(
            pattern=prefix + r"self_attention\.linear_qkv\.(weight|bias)",
            outputs=tuple(rf"decoder.layers.\g<1>.self_attention.linear_{p}.\g<2>" for p in ("q", "k", "v")),
            block_sizes=qkv,
        ),
        UnfuseRule(
            pattern=prefix + r"mlp\.linear_fc1\.weight",
            outputs=(
                r"decoder.layers.\g<1>.mlp.linear_gate.weight",
                r"decoder.layers.\g<1>.mlp.linear_up.weight",
            ),
            block_sizes=(ffn, ffn),
        ),
    )
