"""Masking and aggregation of per-token terms over response tokens.

Two aggregations (``rl_config.token_level_loss``), both exact under gradient accumulation because
each micro-batch is divided by a count of the WHOLE mini-batch:

- token-level (default): every response token of the mini-batch weighs the same, whatever the
  length of its response. A micro-batch contributes ``sum(values * mask) / num_minibatch_tokens``.
- sequence-level: each response's token-mean, then the mean over the mini-batch's sequences, so
  a long response weighs as much as a short one. A micro-batch contributes
  ``sum_rows(row_token_mean) / num_minibatch_sequences``.

Summing the contributions of the micro-batches gives exactly the mini-batch aggregate.
"""

from __future__ import annotations

import torch


def masked_token_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` over positions where ``mask`` is 1 (padding contributes exactly 0)."""
    return _masked(values, mask).sum()


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


def masked_sequence_mean(
    values: torch.Tensor, mask: torch.Tensor, num_sequences: float | None = None
) -> torch.Tensor:
    """Mean over sequences (rows) of each row's masked token-mean.

    ``num_sequences`` is the denominator (the mini-batch's sequence count when ``values`` is one
    micro-batch of it); by default the number of rows here.
    """
    denom = float(values.shape[0]) if num_sequences is None else float(num_sequences)
    counts = mask.sum(dim=-1)
    if denom <= 0 or bool((counts <= 0).any()):
        raise ValueError("masked_sequence_mean needs >= 1 sequence and >= 1 response token in every sequence")
    row_means = _masked(values, mask).sum(dim=-1) / counts.to(values.dtype)
    return row_means.sum() / denom


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    token_level: bool,
    num_tokens: float,
    num_sequences: float,
) -> torch.Tensor:
    """The configured aggregation of one micro-batch's per-token ``values`` (see the module doc)."""
    if token_level:
        return masked_token_mean(values, mask, num_tokens)
    return masked_sequence_mean(values, mask, num_sequences)


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if values.shape != mask.shape:
        raise ValueError(
            f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must have the same shape"
        )
    # where() rather than multiply: a NaN/inf at a padded position must not leak into the sum.
    return torch.where(mask.bool(), values, torch.zeros_like(values))
