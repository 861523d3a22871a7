"""The data side of context parallelism: which sequence positions a CP rank runs, and the
response log-probs reassembled from the ranks' shares. The attention across ranks is TE's or
MindSpeed's (``cp_support``); what is here is everything else a CP step needs::

    micro-batch [B, W] (W a multiple of 2 x CP)  ->  CP rank r runs positions P_r  [B, W / CP]
        zigzag: W cut into 2 x CP chunks, P_r = chunk r + chunk 2 x CP - 1 - r
                (megatron-core 0.19.2 utils._get_batch_on_this_cp_rank_per_sequence_balancing;
                 its RotaryEmbedding cuts the rotary table the same way, rope_utils.
                 get_pos_emb_on_this_cp_rank, so RoPE needs nothing from us)
        contiguous: P_r = part r of CP (MindSpeed's Ulysses split)
    last stage: logits [B, W / CP, V / TP] of P_r
        -> log-prob / entropy of each response token whose logit position is in P_r, 0 elsewhere
        -> summed over the CP group: every CP rank holds every response token's value

The sum's backward is the identity (``vocab_parallel.sum_over_group``): the loss downstream is
computed identically on every CP rank, so each rank back-propagates the whole ``d loss / d logp``
into the tokens it owns, and the attention's own backward returns key/value gradients to the
ranks that own those positions. Per-rank parameter gradients then sum, over the CP ranks, to the
unsplit model's: megatron's DDP reduces over the data-parallel group *with* CP
(``dp_cp_group``, a sum under ``calculate_per_token_loss``), which is exactly that sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mindspeed_rl.models.training.megatron.cp_support import SplitKind, split_kind, width_multiple
from mindspeed_rl.models.training.megatron.layout import DeviceKind, MegatronLayout


@dataclass(frozen=True, slots=True)
class CPSplit:
    """This process's CP setting (set once by ``model.init_model_parallel``)."""

    size: int = 1
    kind: SplitKind = "zigzag"

    @property
    def multiple(self) -> int:
        return width_multiple(self.size, self.kind) if self.size > 1 else 1


_SPLIT: dict[str, CPSplit] = {"split": CPSplit()}
_STAND_IN: dict[str, Any] = {}


def configure(layout: MegatronLayout, device_kind: DeviceKind) -> None:
    cp = layout.context_parallel_size
    _SPLIT["split"] = CPSplit(cp, split_kind(layout.context_parallel_algo, device_kind))


def current() -> CPSplit:
    return _SPLIT["split"]


def set_attention_stand_in(module_class: Any | None) -> None:
    """Register (or, with None, remove) a core-attention class that replaces megatron's local
    ``DotProductAttention`` in the layer spec at CP > 1. For the CPU test only: neither TE nor
    MindSpeed runs on CPU, and megatron's local attention refuses CP."""
    if module_class is None:
        _STAND_IN.clear()
    else:
        _STAND_IN["class"] = module_class


def attention_stand_in() -> Any | None:
    return _STAND_IN.get("class")


def rank_positions(width: int, size: int, rank: int, kind: SplitKind, device: torch.device) -> torch.Tensor:
    """The global positions CP rank ``rank`` runs, in the order it holds them."""
    multiple = width_multiple(size, kind)
    if width % multiple:
        raise ValueError(f"sequence width {width} is not a multiple of {multiple} (context parallel {size})")
    if kind == "contiguous":
        part = width // size
        return torch.arange(rank * part, (rank + 1) * part, device=device)
    chunk = width // (2 * size)
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    second_start = (2 * size - 1 - rank) * chunk
    return torch.cat([first, torch.arange(second_start, second_start + chunk, device=device)])


def _rank() -> tuple[int, int, Any]:
    from megatron.core import parallel_state as ps

    return (
        ps.get_context_parallel_rank(),
        ps.get_context_parallel_world_size(),
        ps.get_context_parallel_group(),
    )


def local_positions(width: int, device: torch.device) -> torch.Tensor | None:
    """This rank's positions of a ``width``-wide micro-batch, or None without CP."""
    split = current()
    if split.size == 1:
        return None
    rank, size, _ = _rank()
    return rank_positions(width, size, rank, split.kind, device)


def owned_logit_index(logit_index: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logit_index`` (global positions, ``[B, R]``) as indices into this rank's logits, and the
    mask of the ones this rank holds (None without CP; the index is then unchanged)."""
    positions = local_positions(width, logit_index.device)
    if positions is None:
        return logit_index, None
    local = torch.full((width,), -1, dtype=torch.long, device=logit_index.device)
    local[positions] = torch.arange(positions.numel(), device=logit_index.device)
    index = local[logit_index]
    owned = index >= 0
    return index.clamp(min=0), owned


def sum_owned(values: torch.Tensor, owned: torch.Tensor | None) -> torch.Tensor:
    """Every response token's value on every CP rank: each rank's owned values, summed over CP
    (identity backward: module docstring)."""
    if owned is None:
        return values
    from mindspeed_rl.models.training.megatron.vocab_parallel import sum_over_group

    _, _, group = _rank()
    return sum_over_group(torch.where(owned, values, torch.zeros_like(values)), group)
