"""Entropy of the sampling distribution at each response position."""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """``-sum_v p_v log p_v`` over the last axis; pass logits already divided by the temperature."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)
