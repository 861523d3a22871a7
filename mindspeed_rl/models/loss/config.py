"""Settings of the GRPO loss, as the config mapper hands them to a training engine (torch-free).

Kept apart from :mod:`.grpo` (which imports torch) so ``trainer.run_plan`` and ``check_config``
can build and validate it on a machine without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mindspeed_rl.models.loss.correction_config import RolloutCorrectionConfig

KL_PENALTY_NAMES = ("kl", "abs", "mse", "low_var_kl")


@dataclass(slots=True, frozen=True, kw_only=True)
class GRPOLossConfig:
    """The ``rl_config`` keys that shape the loss."""

    clip_ratio: float = 0.2
    """PPO clip range eps: ratios outside [1 - eps, 1 + eps] stop contributing gradient."""
    clip_ratio_low: float | None = None
    """Lower eps (ratio floor 1 - low); None = clip_ratio. Set by ``clip_higher_enable``."""
    clip_ratio_high: float | None = None
    """Upper eps (ratio cap 1 + high); None = clip_ratio. DAPO's clip-higher raises it (0.28)."""
    kl_penalty: str = "low_var_kl"
    """Per-token KL estimator: kl | abs | mse | low_var_kl."""
    init_kl_coef: float = 0.001
    """KL weight: constant (kl_ctrl_type fixed) or the adaptive controller's start value."""
    kl_ctrl_type: Literal["fixed", "adaptive"] = "fixed"
    kl_target: float | None = None
    """Adaptive controller: the per-token KL it steers towards."""
    kl_horizon: int | None = None
    """Adaptive controller: samples over which a full +-20% correction is applied."""
    use_kl_in_reward: bool = False
    """True: the KL penalises the reward (before advantages) and the loss has no KL term."""
    token_level_loss: bool = True
    """True: token-mean over the mini-batch. False: per-sequence token-mean, then the mean over
    the mini-batch's sequences (every response weighs the same, whatever its length)."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    rollout_correction: RolloutCorrectionConfig | None = None
    """Off-policy correction (the ``rollout_correction`` section); None: today's PPO ratio against
    the batch's old log-probs, unchanged (the ``rollout_corr/*`` metrics are still reported)."""

    def __post_init__(self) -> None:
        for name, value in (
            ("clip_ratio", self.clip_ratio),
            ("clip_ratio_low", self.clip_ratio_low),
            ("clip_ratio_high", self.clip_ratio_high),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0; got {value}. Set rl_config.{name} (e.g. 0.2).")
        if self.clip_low >= 1:
            raise ValueError(
                f"clip_ratio_low={self.clip_low} would let the ratio floor 1 - low reach 0; use a value < 1"
            )
        if self.kl_penalty not in KL_PENALTY_NAMES:
            raise ValueError(
                f"unknown kl_penalty {self.kl_penalty!r}; set rl_config.kl_penalty to one of "
                f"{sorted(KL_PENALTY_NAMES)}"
            )
        if self.init_kl_coef < 0 or self.entropy_coeff < 0:
            raise ValueError(
                "init_kl_coef and entropy_coeff must be >= 0; got "
                f"{self.init_kl_coef} and {self.entropy_coeff}. Use 0 to disable a term."
            )
        if self.kl_ctrl_type == "adaptive":
            missing = [k for k in ("kl_target", "kl_horizon") if getattr(self, k) is None]
            if missing:
                raise ValueError(
                    f"kl_ctrl_type: adaptive needs rl_config.{' and rl_config.'.join(missing)}; set them "
                    "(e.g. kl_target: 0.1, kl_horizon: 10000) or use kl_ctrl_type: fixed"
                )
            if (self.kl_target or 0) <= 0 or (self.kl_horizon or 0) < 1 or self.init_kl_coef <= 0:
                raise ValueError(
                    f"kl_ctrl_type: adaptive needs kl_target > 0, kl_horizon >= 1 and init_kl_coef > 0; got "
                    f"kl_target={self.kl_target}, kl_horizon={self.kl_horizon}, init_kl_coef={self.init_kl_coef}"
                )

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high

    @property
    def needs_reference(self) -> bool:
        """A KL term exists (in the loss or in the reward), so reference log-probs are needed."""
        return self.init_kl_coef > 0

    @property
    def kl_in_loss(self) -> bool:
        return self.needs_reference and not self.use_kl_in_reward
