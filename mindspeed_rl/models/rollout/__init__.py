"""Rollout engines (vLLM, HF) behind the `RolloutEngine` Protocol; heavy backends import lazily."""

from mindspeed_rl.models.rollout.base import (
    Completion,
    RolloutEngine,
    SamplingConfig,
    sampling_config_from_mapping,
)
from mindspeed_rl.models.rollout.factory import build_rollout_engine

__all__ = [
    "Completion",
    "RolloutEngine",
    "SamplingConfig",
    "build_rollout_engine",
    "sampling_config_from_mapping",
]
