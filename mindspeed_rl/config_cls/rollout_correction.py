"""``rollout_correction``: off-policy correction of the policy loss (verl's key names).

Absent, or every key null: the loss is today's (the async pipeline's ratio is taken against the
rollout log-probs, the hybrid's against the trainer's own); the ``rollout_corr/*`` metrics are
reported either way. The plan (``plan.sections.rollout_correction``) resolves the section into
the engine's :class:`~mindspeed_rl.models.loss.correction_config.RolloutCorrectionConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindspeed_rl.config_cls.fields import opt


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutCorrectionSection:
    rollout_is: str | None = opt(
        None,
        "IS weight w = pi_prox / pi_rollout: token (per token) | sequence (product over the "
        "response) | null (none; metrics only).",
    )
    rollout_is_threshold: float | str | None = opt(
        None,
        "A number: truncate w at it (default 2.0 when rollout_is is set). A 'lo_hi' string such "
        "as '0.5_2.0': mask tokens (sequences) whose w is outside [lo, hi] (IcePop).",
    )
    rollout_rs: str | None = opt(
        None,
        "Rejection mask on a divergence between pi_prox and pi_rollout: token_k1|token_k2|token_k3 "
        "(tokens), seq_sum_k1..k3|seq_mean_k1..k3|seq_max_k2|seq_max_k3 (whole responses); null: off.",
    )
    rollout_rs_threshold: float | None = opt(None, "Reject where that divergence exceeds this.")
    mode: str | None = opt(
        None,
        "bypass: the PPO ratio is against the rollout log-probs | decoupled: against a proximal "
        "policy (prox_logp), times w. null: the pipeline's own anchor (async: bypass; hybrid: "
        "decoupled with the trainer's recomputed log-probs).",
    )
    prox_logp: str | None = opt(
        None,
        "decoupled only: recompute (one extra forward with the weights at the start of the update; "
        "default) | loglinear (no forward: log pi_prox = log pi_b + alpha (log pi_theta - log pi_b), "
        "alpha from each sample's version).",
    )
    m2_threshold: float | None = opt(
        None, "M2PO: mask the tokens of largest (log rho)^2 until their mean is <= this (e.g. 0.04)."
    )
