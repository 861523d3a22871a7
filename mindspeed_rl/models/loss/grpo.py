"""The GRPO objective: clipped policy loss + fixed-coefficient KL penalty - entropy bonus.

``loss = pg_loss + init_kl_coef * kl - entropy_coeff * entropy``, every term a token-mean over the
mini-batch (see :mod:`.aggregate`). The KL term is part of the loss (as in GRPO), not folded into
the reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mindspeed_rl.models.loss.aggregate import masked_token_sum
from mindspeed_rl.models.loss.kl import KL_PENALTIES, kl_penalty
from mindspeed_rl.models.loss.policy import clipped_policy_loss


@dataclass(slots=True, frozen=True, kw_only=True)
class GRPOLossConfig:
    """The ``rl_config`` keys that shape the loss."""

    clip_ratio: float = 0.2
    """PPO clip range eps: ratios outside [1 - eps, 1 + eps] stop contributing gradient."""
    kl_penalty: str = "low_var_kl"
    """Per-token KL estimator: kl | abs | mse | low_var_kl."""
    init_kl_coef: float = 0.001
    """Weight of the KL term; constant for the run (kl_ctrl_type: fixed)."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""

    def __post_init__(self) -> None:
        if self.clip_ratio <= 0:
            raise ValueError(
                f"clip_ratio must be > 0; got {self.clip_ratio}. Set rl_config.clip_ratio (e.g. 0.2)."
            )
        if self.kl_penalty not in KL_PENALTIES:
            raise ValueError(
                f"unknown kl_penalty {self.kl_penalty!r}; set rl_config.kl_penalty to one of {sorted(KL_PENALTIES)}"
            )
        if self.init_kl_coef < 0 or self.entropy_coeff < 0:
            raise ValueError(
                "init_kl_coef and entropy_coeff must be >= 0; got "
                f"{self.init_kl_coef} and {self.entropy_coeff}. Use 0 to disable a term."
            )


@dataclass(slots=True, frozen=True, kw_only=True)
class GRPOLossTerms:
    """Scalars for one micro-batch, each already divided by the mini-batch token count."""

    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor
    clip_frac: torch.Tensor


def grpo_loss(
    *,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GRPOLossConfig,
    num_tokens: float,
    ref_log_probs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> GRPOLossTerms:
    """GRPO loss of one micro-batch of shape ``[B, T]``; ``advantages`` is ``[B]`` or ``[B, T]``.

    ``num_tokens`` is the number of response tokens in the whole *mini-batch* (not this micro-batch),
    so that summing the returned terms over micro-batches yields mini-batch token-means.
    """
    if num_tokens <= 0:
        raise ValueError("num_tokens must be > 0: a mini-batch needs at least one response token")
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    per_token_pg, is_clipped = clipped_policy_loss(log_probs, old_log_probs, adv, config.clip_ratio)
    pg = masked_token_sum(per_token_pg, mask) / num_tokens
    clip_frac = masked_token_sum(is_clipped, mask).detach() / num_tokens
    loss = pg
    kl = torch.zeros((), dtype=log_probs.dtype)
    if ref_log_probs is not None:
        kl = masked_token_sum(kl_penalty(log_probs, ref_log_probs, config.kl_penalty), mask) / num_tokens
        loss = loss + config.init_kl_coef * kl
    elif config.init_kl_coef > 0:
        raise ValueError(
            f"init_kl_coef={config.init_kl_coef} needs reference log-probs; pass ref_log_probs "
            "or set rl_config.init_kl_coef: 0"
        )
    ent = torch.zeros((), dtype=log_probs.dtype)
    if entropy is not None:
        ent = masked_token_sum(entropy, mask) / num_tokens
        if config.entropy_coeff > 0:
            loss = loss - config.entropy_coeff * ent
    elif config.entropy_coeff > 0:
        raise ValueError("entropy_coeff > 0 needs per-token entropy; pass entropy= (or set entropy_coeff: 0)")
    return GRPOLossTerms(
        loss=loss, pg_loss=pg.detach(), kl=kl.detach(), entropy=ent.detach(), clip_frac=clip_frac
    )
