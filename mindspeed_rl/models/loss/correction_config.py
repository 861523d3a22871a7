"""Settings of the off-policy (rollout) correction, as the plan hands them to a training engine.

Torch-free, like :mod:`.config`: the plan builds and validates it on machines without torch.
Key names follow verl's ``rollout_correction`` section; :mod:`.rollout_correction` implements
them. Three policies take part (AReaL's decoupled PPO):

* pi_b, the behaviour policy: the rollout engine's own log-probs of the sampled tokens, from
  the weights version each sample carries;
* pi_prox, the proximal policy the PPO ratio is clipped around;
* pi_theta, the weights being trained.

``bypass``: pi_prox = pi_b (the ratio is taken against the rollout log-probs). ``decoupled``:
pi_prox is the trainer's weights at the start of the update, recomputed (one extra forward) or
log-linearly interpolated from the versions; the loss is then ``w * PPO(pi_theta / pi_prox)``
with ``w = pi_prox / pi_b``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

IS_LEVELS = ("token", "sequence")
RS_MODES = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip
MODES = ("bypass", "decoupled")
PROX_LOGP = ("recompute", "loglinear")
DEFAULT_IS_THRESHOLD = 2.0
LOG_CLAMP = 20.0
"""Every log-ratio is clamped to [-20, 20] before exponentiation: weights stay in [e^-20, e^20]."""


@dataclass(slots=True, frozen=True, kw_only=True)
class RolloutCorrectionConfig:
    """One resolved correction (``mode`` is concrete here; the plan resolves ``mode: null``)."""

    mode: Literal["bypass", "decoupled"] = "bypass"
    prox_logp: Literal["recompute", "loglinear"] = "recompute"
    """decoupled only. recompute: pi_prox are the log-probs the Training Unit computes with the
    weights at the start of the update (the batch's old log-probs, or the current ones when one
    optimizer step consumes the batch and the pipeline skips that forward). loglinear: no extra
    forward, ``log pi_prox = log pi_b + alpha (log pi_theta - log pi_b)`` with ``alpha`` from the
    versions (:func:`~mindspeed_rl.models.loss.rollout_correction.loglinear_alpha`)."""
    rollout_is: Literal["token", "sequence"] | None = None
    """IS weight ``w = pi_prox / pi_b`` per token, or its product over the response (one weight per
    sequence); None: no weight (metrics only)."""
    is_upper: float | None = None
    """Truncated IS: ``w = min(w, is_upper)``."""
    is_bounds: tuple[float, float] | None = None
    """IcePop-style masking (the ``"lo_hi"`` threshold): tokens (sequences) whose weight lies
    outside [lo, hi] leave the policy loss; the others keep their (safety-clamped) weight."""
    rollout_rs: str | None = None
    """Rejection mask on a divergence between pi_prox and pi_b: token_k* masks tokens, seq_* whole
    responses (sum, mean or max over the response); k1 = |log rho|, k2 = (log rho)^2 / 2,
    k3 = rho - 1 - log rho, rho = pi_prox / pi_b."""
    rollout_rs_threshold: float | None = None
    """Reject where the divergence exceeds this."""
    m2_threshold: float | None = None
    """M2PO: mask the tokens of largest (log rho)^2 until the mean of (log rho)^2 over the kept
    tokens of the micro-batch is <= m2_threshold."""

    def __post_init__(self) -> None:
        where = "rollout_correction"
        if self.mode not in MODES:
            raise ValueError(f"unknown {where}.mode {self.mode!r}; use one of {list(MODES)} (or null)")
        if self.prox_logp not in PROX_LOGP:
            raise ValueError(f"unknown {where}.prox_logp {self.prox_logp!r}; use one of {list(PROX_LOGP)}")
        if self.rollout_is is not None and self.rollout_is not in IS_LEVELS:
            raise ValueError(
                f"unknown {where}.rollout_is {self.rollout_is!r}; use one of {list(IS_LEVELS)} or null"
            )
        if self.rollout_rs is not None and self.rollout_rs not in RS_MODES:
            raise ValueError(
                f"unknown {where}.rollout_rs {self.rollout_rs!r}; use one of {list(RS_MODES)} or null"
            )
        if self.rollout_is is None and (self.is_upper is not None or self.is_bounds is not None):
            raise ValueError(
                f"{where}.rollout_is_threshold has no effect without rollout_is; set rollout_is: "
                "token or sequence, or remove the threshold"
            )
        if self.is_upper is not None and self.is_bounds is not None:
            raise ValueError(f"{where}.rollout_is_threshold is either an upper clamp or a 'lo_hi' pair")
        if self.is_upper is not None and not self.is_upper > 0:
            raise ValueError(f"{where}.rollout_is_threshold={self.is_upper}; use a value > 0 (e.g. 2.0)")
        if self.is_bounds is not None:
            lo, hi = self.is_bounds
            if not 0 <= lo < hi:
                raise ValueError(f"{where}.rollout_is_threshold '{lo}_{hi}' needs 0 <= lo < hi")
        if self.rollout_is is not None and self.mode == "bypass" and self.is_upper is not None:
            raise ValueError(
                f"{where}.rollout_is with a truncation threshold does nothing in mode: bypass (the "
                "PPO ratio is already pi_theta / pi_rollout, so w = 1); use mode: decoupled, a "
                "'lo_hi' threshold to mask, or rollout_is: null"
            )
        if (self.rollout_rs is None) != (self.rollout_rs_threshold is None):
            raise ValueError(
                f"{where}.rollout_rs and rollout_rs_threshold go together; set both (e.g. "
                "rollout_rs: seq_mean_k3, rollout_rs_threshold: 0.01) or neither"
            )
        if self.rollout_rs_threshold is not None and not self.rollout_rs_threshold > 0:
            raise ValueError(f"{where}.rollout_rs_threshold={self.rollout_rs_threshold}; use a value > 0")
        if self.m2_threshold is not None and not self.m2_threshold > 0:
            raise ValueError(f"{where}.m2_threshold={self.m2_threshold}; use a value > 0 (e.g. 0.04)")

    @property
    def changes_loss(self) -> bool:
        """False: the loss is plain PPO against the anchor (the default path, bit for bit)."""
        return (
            self.mode == "decoupled"
            or self.is_bounds is not None
            or self.rollout_rs is not None
            or self.m2_threshold is not None
        )


def parse_is_threshold(
    value: float | str | None, rollout_is: str | None
) -> tuple[float | None, tuple[float, float] | None]:
    """``rollout_is_threshold`` as (upper clamp, None) or (None, (lo, hi)); a string is ``"lo_hi"``."""
    if value is None:
        return (DEFAULT_IS_THRESHOLD if rollout_is is not None else None), None
    if isinstance(value, str):
        parts = value.split("_")
        try:
            lo, hi = (float(p) for p in parts)
        except ValueError:
            raise ValueError(
                f"rollout_correction.rollout_is_threshold {value!r}: a string must be 'lo_hi' "
                "(e.g. '0.5_2.0': mask weights outside [0.5, 2.0]); a number is an upper clamp"
            ) from None
        return None, (lo, hi)
    return float(value), None
