"""Group-normalised advantages (GRPO's ``adv_estimator: group_norm``)."""

from __future__ import annotations

import torch

GROUP_NORM_EPS = 1e-6


def group_norm_advantages(
    rewards: torch.Tensor, n_samples_per_prompt: int, *, eps: float = GROUP_NORM_EPS
) -> torch.Tensor:
    """Return ``(r - mean_g) / (std_g + eps)`` for every sample, ``g`` being its prompt group.

    ``rewards`` is 1-D and ordered group by group: samples ``[i*n, (i+1)*n)`` belong to prompt ``i``.

    Choices made explicit:
    - ``std_g`` is the *unbiased* (Bessel-corrected, ``n - 1``) standard deviation, which is what
      ``torch.std`` gives by default and what common GRPO implementations use.
    - When every reward of a group is equal, ``r - mean_g`` is exactly zero, so the group's
      advantages are exactly zero (the ``eps`` keeps the division finite): such a group carries no
      policy-gradient signal, only KL/entropy terms act on it.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (one scalar per sample); got shape {tuple(rewards.shape)}")
    if n_samples_per_prompt < 2:
        raise ValueError(
            f"group_norm needs n_samples_per_prompt >= 2 to estimate a group std; got "
            f"{n_samples_per_prompt}. Set rl_config.n_samples_per_prompt to 2 or more."
        )
    if rewards.numel() % n_samples_per_prompt != 0:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of n_samples_per_prompt="
            f"{n_samples_per_prompt}; pass all n samples of every prompt together."
        )
    groups = rewards.to(torch.float32).view(-1, n_samples_per_prompt)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True, unbiased=True)
    return ((groups - mean) / (std + eps)).reshape(-1)
