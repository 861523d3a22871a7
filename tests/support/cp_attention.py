"""A context-parallel attention STAND-IN for CPU tests: neither TransformerEngine's CP attention
(CUDA) nor MindSpeed's (NPU) runs on a CPU host, and megatron's local ``DotProductAttention``
refuses ``context_parallel_size > 1``. Never used by a real run (``context_parallel.
set_attention_stand_in`` is called only by tests; ``cp_support`` refuses CP on CPU otherwise).

What it computes is exact causal attention over the whole sequence, as TE's ring (p2p) attention
does, by the simplest communication: every CP rank all-gathers the keys and values of the other
ranks (backward: each rank's key/value gradients summed over the ranks and returned to the rank
that owns those positions, what TE's ring sends back), puts them in sequence order by the split
the engine used (``context_parallel.rank_positions``), and masks each of its queries by global
position. Its constructor and forward take megatron-core's core-attention arguments (0.19.2
``transformer/dot_product_attention.py``; 0.12.1 the same names), and like megatron's local
attention it repeats the key/value groups for grouped-query attention.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from mindspeed_rl.models.training.megatron import context_parallel


class _GatherSeq(torch.autograd.Function):
    """All-gather along dim 0 over ``group`` (rank order); backward: sum over ranks, own slice."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.group, ctx.rank, ctx.rows = group, rank, tensor.shape[0]
        parts = [torch.empty_like(tensor) for _ in range(size)]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)  # gloo has no reduce-scatter; sum, then own rows
        return total[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows], None


class AllGatherKVAttentionStandIn(torch.nn.Module):
    """Test stand-in for TE's / MindSpeed's CP attention (module docstring)."""

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: Any = None,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        **_: Any,
    ) -> None:
        super().__init__()
        self.config = config
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Any,
        attn_mask_type: Any = None,
        attention_bias: Any = None,
        packed_seq_params: Any = None,
        **_: Any,
    ) -> torch.Tensor:
        from megatron.core import parallel_state as ps

        if packed_seq_params is not None:
            raise ValueError("the CP attention stand-in takes padded [s, b, h, d] batches only")
        group = ps.get_context_parallel_group()
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        rows, batch, heads, dim = query.shape  # [s/cp, b, heads, d]
        width = rows * size
        kind = context_parallel.current().kind
        held = torch.cat(
            [context_parallel.rank_positions(width, size, r, kind, query.device) for r in range(size)]
        )
        order = torch.argsort(held)  # gathered rows (rank order) -> sequence order
        keys = _GatherSeq.apply(key, group)[order]
        values = _GatherSeq.apply(value, group)[order]
        repeat = heads // keys.shape[2]
        if repeat > 1:
            keys = keys.repeat_interleave(repeat, dim=2)
            values = values.repeat_interleave(repeat, dim=2)
        mine = context_parallel.rank_positions(width, size, rank, kind, query.device)
        future = mine[:, None] < torch.arange(width, device=query.device)[None, :]  # [s/cp, s]
        scores = torch.einsum("sbhd,tbhd->bhst", query.float(), keys.float()) * self.scale
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1).to(query.dtype)
        out = torch.einsum("bhst,tbhd->sbhd", probs, values)
        return out.reshape(rows, batch, heads * dim)
