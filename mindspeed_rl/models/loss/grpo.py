"""The GRPO objective: clipped policy loss + KL penalty - entropy bonus.

``loss = pg_loss + kl_coef * kl - entropy_coeff * entropy``, every term aggregated over the
mini-batch as ``token_level_loss`` asks (see :mod:`.aggregate`). The KL term is part of the loss
(as in GRPO) unless ``use_kl_in_reward``, where the trainer has already folded it into the reward
and the loss only reports the KL.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mindspeed_rl.models.loss.aggregate import aggregate
from mindspeed_rl.models.loss.config import GRPOLossConfig
from mindspeed_rl.models.loss.kl import kl_penalty
from mindspeed_rl.models.loss.policy import clipped_policy_loss

__all__ = ["GRPOLossConfig", "GRPOLossTerms", "grpo_loss"]


@dataclass(slots=True, frozen=True, kw_only=True)
class GRPOLossTerms:
    """Scalars for one micro-batch, each already divided by the mini-batch token/sequence count."""

    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor
    clip_frac: torch.Tensor
    correction_sums: torch.Tensor | None = None
    """Detached off-policy statistics (``rollout_correction.Correction.stat_sums``), or None."""
    correction_max: torch.Tensor | None = None


def grpo_loss(
    *,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GRPOLossConfig,
    num_tokens: float,
    num_sequences: float | None = None,
    ref_log_probs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    kl_coef: float | None = None,
    pg_weights: torch.Tensor | None = None,
    pg_keep: torch.Tensor | None = None,
) -> GRPOLossTerms:
    """GRPO loss of one micro-batch of shape ``[B, T]``; ``advantages`` is ``[B]`` or ``[B, T]``.

    ``num_tokens`` / ``num_sequences`` count the whole *mini-batch* (not this micro-batch), so that
    summing the returned terms over micro-batches yields the mini-batch aggregate;
    ``num_sequences`` is required when ``config.token_level_loss`` is false. ``kl_coef`` is the
    current coefficient of an adaptive controller (default: ``config.init_kl_coef``).
    ``clip_frac`` is always a token fraction. ``pg_weights`` (detached, ``[B, R]``) multiply the
    per-token policy loss and ``pg_keep`` (bool) drops tokens from it, keeping the normaliser
    (off-policy correction, :mod:`.rollout_correction`); None leaves the loss as it was.
    """
    if num_tokens <= 0:
        raise ValueError("num_tokens must be > 0: a mini-batch needs at least one response token")
    if not config.token_level_loss and num_sequences is None:
        raise ValueError("token_level_loss=False aggregates per sequence; pass num_sequences (mini-batch)")

    def agg(values: torch.Tensor) -> torch.Tensor:
        return aggregate(
            values,
            mask,
            token_level=config.token_level_loss,
            num_tokens=num_tokens,
            num_sequences=float(num_sequences or 0),
        )

    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    per_token_pg, is_clipped = clipped_policy_loss(
        log_probs, old_log_probs, adv, config.clip_low, config.clip_high
    )
    if pg_weights is not None:
        per_token_pg = per_token_pg * pg_weights
    if pg_keep is not None:
        per_token_pg = torch.where(pg_keep, per_token_pg, torch.zeros_like(per_token_pg))
    pg = agg(per_token_pg)
    clip_frac = aggregate(is_clipped, mask, token_level=True, num_tokens=num_tokens, num_sequences=0).detach()
    loss = pg
    kl = torch.zeros((), dtype=log_probs.dtype)
    coef = config.init_kl_coef if kl_coef is None else kl_coef
    if ref_log_probs is not None:
        kl = agg(kl_penalty(log_probs, ref_log_probs, config.kl_penalty))
        if config.kl_in_loss:
            loss = loss + coef * kl
    elif config.kl_in_loss:
        raise ValueError(
            f"init_kl_coef={config.init_kl_coef} needs reference log-probs; pass ref_log_probs "
            "or set rl_config.init_kl_coef: 0"
        )
    ent = torch.zeros((), dtype=log_probs.dtype)
    if entropy is not None:
        ent = agg(entropy)
        if config.entropy_coeff > 0:
            loss = loss - config.entropy_coeff * ent
    elif config.entropy_coeff > 0:
        raise ValueError("entropy_coeff > 0 needs per-token entropy; pass entropy= (or set entropy_coeff: 0)")
    return GRPOLossTerms(
        loss=loss, pg_loss=pg.detach(), kl=kl.detach(), entropy=ent.detach(), clip_frac=clip_frac
    )
