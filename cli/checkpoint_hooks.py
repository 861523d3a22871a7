"""Test-only checkpoint hook for ``cli/train_grpo.py``, read from the environment here so no
production module reads test hooks (as ``cli/fault_hooks.py`` does for faults).

``MINDSPEED_RL_TEST_CHECKPOINT_HOLD=N`` makes the checkpoint written after N iterations stop
between its files and its commit (the manifest and the rename): it writes ``HOLDING`` into its
partial folder and waits there until the test kills the run, so a crash test kills it mid-write at
a known point instead of after a timed delay.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig

HOLD_ENV = "MINDSPEED_RL_TEST_CHECKPOINT_HOLD"


def hold_iteration(env: Mapping[str, str]) -> int | None:
    raw = env.get(HOLD_ENV, "")
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{HOLD_ENV}={raw!r}: give the iteration whose checkpoint to hold, an integer >= 1")
    return int(raw)


def hold_iteration_for(config: GRPOConfig, env: Mapping[str, str]) -> int | None:
    """The checkpoint ``env`` asks the async run to hold before its commit; None when it asks none."""
    iteration = hold_iteration(env)
    if iteration is not None and config.rl_config.pipeline != "async":
        raise ValueError(f"{HOLD_ENV} is implemented for rl_config.pipeline=async only")
    return iteration
