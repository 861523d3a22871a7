"""Rule-based rewards: the verifier registry and its verifiers (math, format, maze, demo)."""

from mindspeed_rl.models.rewards.config import RewardConfig
from mindspeed_rl.models.rewards.registry import (
    RewardFunction,
    RewardResult,
    Verifier,
    build_reward_fn,
    get_verifier,
    known_verifiers,
    register_verifier,
    unregister_verifier,
)

__all__ = [
    "RewardConfig",
    "RewardFunction",
    "RewardResult",
    "Verifier",
    "build_reward_fn",
    "get_verifier",
    "known_verifiers",
    "register_verifier",
    "unregister_verifier",
]
