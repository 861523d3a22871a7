"""Token-level clipped-ratio policy loss (PPO surrogate as used by GRPO), optionally asymmetric."""

from __future__ import annotations

import torch


def clipped_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio: float,
    clip_ratio_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``max(-A * ratio, -A * clip(ratio, 1 - low, 1 + high))`` and a per-token clipped flag.

    ``ratio = exp(logp - old_logp)``; ``low = clip_ratio`` and ``high = clip_ratio_high`` (default:
    ``clip_ratio``, the symmetric PPO clip). DAPO's clip-higher raises only ``high`` so that
    low-probability tokens with positive advantage can grow further before their gradient is cut.
    ``advantages`` broadcasts against the token tensors (GRPO gives one scalar per sample, shape
    ``[B, 1]``). The flag is 1 where the clipped branch is the active (larger) one, i.e. where the
    gradient is cut; its masked mean is ``clip_frac``.
    """
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if clip_ratio <= 0 or high <= 0:
        raise ValueError(
            f"clip ratios must be > 0; got low={clip_ratio}, high={high}. Set rl_config.clip_ratio (e.g. 0.2)."
        )
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + high)
    is_clipped = (clipped > unclipped).to(log_probs.dtype)
    return torch.maximum(unclipped, clipped), is_clipped
