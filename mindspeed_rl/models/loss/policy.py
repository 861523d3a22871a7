"""Token-level clipped-ratio policy loss (PPO surrogate as used by GRPO)."""

from __future__ import annotations

import torch


def clipped_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps))`` and a per-token clipped flag.

    ``ratio = exp(logp - old_logp)``. ``advantages`` broadcasts against the token tensors (GRPO gives
    one scalar per sample, shape ``[B, 1]``). The flag is 1 where the clipped branch is the active
    (larger) one, i.e. where the gradient is cut; its masked mean is ``clip_frac``.
    """
    if clip_ratio <= 0:
        raise ValueError(f"clip_ratio must be > 0; got {clip_ratio}. Set rl_config.clip_ratio (e.g. 0.2).")
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    is_clipped = (clipped > unclipped).to(log_probs.dtype)
    return torch.maximum(unclipped, clipped), is_clipped
