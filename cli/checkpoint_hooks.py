"""Test-only checkpoint hook for ``cli/train_grpo.py``, read from the environment here so no
production module reads test hooks (as ``cli/fault_hooks.py`` does for faults).

``MINDSPEED_RL_TEST_CHECKPOINT_DELAY=SECONDS`` makes every checkpoint write wait that long between
its files and its commit (the manifest and the rename), so a crash test can kill the run mid-write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.trainer.pipeline_inputs import PipelineInputs

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


def with_commit_delay(
    config: GRPOConfig, run_dir: Path, env: Mapping[str, str], inputs: PipelineInputs | None
) -> PipelineInputs | None:
    """``inputs`` (or the config's, built here) with the delay ``env`` asks for; unchanged when none."""
    seconds = commit_delay(env)
    if seconds == 0:
        return inputs
    if config.rl_config.pipeline != "async":
        raise ValueError(f"{DELAY_ENV} is implemented for rl_config.pipeline=async only")
    if inputs is None:
        from mindspeed_rl.plan.sections import checkpoint_spec
        from mindspeed_rl.trainer import async_setup, checkpointing, components

        policy_path = str(components.prepare_policy_model(config))
        resumed = checkpointing.resume_point(config, checkpoint_spec(config))
        inputs = async_setup.run_inputs(config, policy_path, run_dir, None, resumed)
    return dataclasses.replace(inputs, checkpoint_commit_delay_s=seconds)
