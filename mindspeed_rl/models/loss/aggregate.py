"""Masking and aggregation of per-token terms over response tokens.

GRPO here uses a *token-mean over the mini-batch*: every response token of the mini-batch has the
same weight, whatever the length of its response (long answers are not down-weighted per token, as
a per-sequence mean would do). Because a mini-batch is processed as several micro-batches with
gradient accumulation, each micro-batch contributes ``sum(values * mask) / num_minibatch_tokens``;
summing those contributions gives exactly the token-mean of the whole mini-batch.
"""

from __future__ import annotations

import torch


def masked_token_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` over positions where ``mask`` is 1 (padding contributes exactly 0)."""
    if values.shape != mask.shape:
        raise ValueError(
            f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must have the same shape"
        )
    # where() rather than multiply: a NaN/inf at a padded position must not leak into the sum.
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum()


def masked_token_mean(
    values: torch.Tensor, mask: torch.Tensor, num_tokens: float | None = None
) -> torch.Tensor:
    """Token-mean of ``values`` under ``mask``.

    ``num_tokens`` is the denominator; pass the token count of the whole mini-batch when ``values``
    is one micro-batch of it. By default it is this tensor's own number of masked tokens.
    """
    denom = float(mask.sum().item()) if num_tokens is None else float(num_tokens)
    if denom <= 0:
        raise ValueError(
            "masked_token_mean over zero response tokens; every sample needs >= 1 response token"
        )
    return masked_token_sum(values, mask) / denom
