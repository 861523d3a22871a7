"""Log-probs and entropy of sampled tokens from vocab-parallel logits, without a full-vocab gather.

Each TP rank holds logits for a contiguous slice of the (padded) vocabulary. The softmax statistics
need all-reduces over the TP group: the max (for stability, no gradient), the sum of exponentials
``S``, the target logit (which lives on one rank) and, for the entropy, ``T = sum_v e^{s_v} s_v``.
Columns past the real vocabulary (megatron's padding) are excluded, so the distribution is the
HF model's.

Gradients. With ``s`` the max-shifted logits, ``log p_t = s_t - log S`` and
``H = log S - T / S``. Every quantity downstream of a group sum is computed identically on every
rank from the reduced values, so ``d loss / d S`` and ``d loss / d T`` are complete on each rank and
the identity backward of :class:`_SumOverGroup` hands each rank the exact gradient of its own
summands: ``d H / d s_v = -p_v (s_v - log S + H)`` for the columns it holds.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

# Finite stand-in for -inf on padded vocabulary columns: exp() is exactly 0 and p * logit stays 0
# (a true -inf would turn the entropy's p * logit into NaN).
_PAD_LOGIT = -1e30


class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) forward, identity backward.

    Identity is the exact gradient only while everything downstream of the reduced value is
    computed identically on every rank (so each rank's ``d loss / d sum`` is the whole of it): each
    rank back-propagates that into its own summand. A rank-local consumer of the sum would hold only
    its share of ``d loss / d sum``, which would then have to be summed over the group.
    """

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        out = tensor.clone()
        if group is not None and dist.get_world_size(group) > 1:
            dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def sum_over_group(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    out = _SumOverGroup.apply(tensor, group)
    assert isinstance(out, torch.Tensor)
    return out


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_start: int,
    vocab_size: int,
    group: Any,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_softmax(logits)[target]`` and (optionally) the entropy, both ``targets.shape``.

    ``logits`` is this rank's ``[..., V_local]`` slice (already temperature-scaled), covering global
    ids ``[vocab_start, vocab_start + V_local)``; ids ``>= vocab_size`` are padding.
    """
    logits = logits.float()
    local = logits.shape[-1]
    ids = torch.arange(vocab_start, vocab_start + local, device=logits.device)
    if vocab_start + local > vocab_size:
        logits = logits.masked_fill(ids >= vocab_size, _PAD_LOGIT)
    peak = logits.detach().amax(dim=-1)
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - peak.unsqueeze(-1)
    total = sum_over_group(shifted.exp().sum(dim=-1), group)
    log_norm = torch.log(total)
    owned = (targets >= vocab_start) & (targets < vocab_start + local)
    local_index = (targets - vocab_start).clamp(0, local - 1)
    picked = torch.gather(shifted, -1, local_index.unsqueeze(-1)).squeeze(-1)
    target_logit = sum_over_group(torch.where(owned, picked, torch.zeros_like(picked)), group)
    log_probs = target_logit - log_norm
    if not with_entropy:
        return log_probs, None
    # E[s] = T / S from two group sums keeps log S out of the rank-local sums. Summing p_v s_v with
    # p_v = exp(s_v - log S) instead would make each rank's d H / d log S = 1 + E_local[s] (its own
    # columns only) where the true one is 1 + E[s], i.e. an error p_v (E_local[s] - E[s]) in
    # d H / d s_v at TP > 1 unless that shared gradient were all-reduced; largest for near-uniform
    # distributions, where E_local[s] is far from E[s].
    weighted = sum_over_group((shifted.exp() * shifted).sum(dim=-1), group)
    return log_probs, log_norm - weighted / total
