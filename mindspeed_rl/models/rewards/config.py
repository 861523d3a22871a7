"""Settings of the reward stage, as the config mapper hands them to the Training Unit (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from mindspeed_rl.models.rewards.overlong import OverlongPenalty


@dataclass(frozen=True, slots=True, kw_only=True)
class RewardConfig:
    """``rl_config``'s verifier keys."""

    verifier_function: tuple[str, ...]
    """Verifier names (registry); unknown names are errors."""
    verifier_weight: tuple[float, ...]
    """One weight per verifier; the reward is the weighted sum."""
    verifier_parallel: int = 1
    """Worker processes scoring responses; 1 scores in the calling process."""
    verifier_timeout: float = 30.0
    """Seconds one response may take to verify; a response that times out scores 0 and is counted."""
    overlong: OverlongPenalty | None = None
    """DAPO's soft overlong penalty (``overlong_buffer_enable``), added to the weighted sum."""
