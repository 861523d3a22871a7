"""Rule-based rewards: the verifier registry and its verifiers (math, format, maze, demo)."""

from mindspeed_rl.models.rewards.registry import (
    RewardFunction,
    RewardResult,
    Verifier,
    build_reward_fn,
    get_verifier,
    known_verifiers,
)

__all__ = ["RewardFunction", "RewardResult", "Verifier", "build_reward_fn", "get_verifier", "known_verifiers"]
