"""Test-only checkpoint hook for ``cli/train_grpo.py``, read from the environment here so no
production module reads test hooks (as ``cli/fault_hooks.py`` does for faults).

``MINDSPEED_RL_TEST_CHECKPOINT_DELAY=SECONDS`` makes every checkpoint write wait that long between
its files and its commit (the manifest and the rename), so a crash test can kill the run mid-write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig

DELAY_ENV = "MINDSPEED_RL_TEST_CHECKPOINT_DELAY"


def commit_delay(env: Mapping[str, str]) -> float:
    raw = env.get(DELAY_ENV, "")
    if not raw:
        return 0.0
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{DELAY_ENV}={raw!r}: give the delay in seconds, a number >= 0")
    return seconds


def commit_delay_for(config: GRPOConfig, env: Mapping[str, str]) -> float:
    """The delay ``env`` asks the async run's checkpoint writes for; 0 when it asks none."""
    seconds = commit_delay(env)
    if seconds and config.rl_config.pipeline != "async":
        raise ValueError(f"{DELAY_ENV} is implemented for rl_config.pipeline=async only")
    return seconds
