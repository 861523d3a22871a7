"""KL coefficient controllers (``rl_config.kl_ctrl_type``), torch-free.

adaptive is the PPO controller of Ziegler et al. (2019), as most RLHF stacks implement it::

    error = clip(kl / kl_target - 1, -0.2, 0.2)
    coef *= 1 + error * n_samples / kl_horizon

so a KL above target raises the coefficient, by at most 20% per ``kl_horizon`` samples.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindspeed_rl.models.loss.config import GRPOLossConfig

ADAPTIVE_ERROR_CLIP = 0.2


@dataclass(slots=True)
class KLController:
    """The coefficient carried across iterations by a training engine."""

    value: float
    target: float | None = None
    horizon: int | None = None
    """None (with target None): fixed controller, ``update`` leaves ``value`` alone."""

    def update(self, current_kl: float, num_samples: int) -> None:
        if self.target is None or self.horizon is None:
            return
        error = min(max(current_kl / self.target - 1.0, -ADAPTIVE_ERROR_CLIP), ADAPTIVE_ERROR_CLIP)
        self.value *= 1.0 + error * num_samples / self.horizon

    def state_dict(self) -> dict[str, float]:
        """Only the coefficient moves; target and horizon come from the config."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


def build_kl_controller(config: GRPOLossConfig) -> KLController:
    if config.kl_ctrl_type == "adaptive":
        return KLController(value=config.init_kl_coef, target=config.kl_target, horizon=config.kl_horizon)
    return KLController(value=config.init_kl_coef)
