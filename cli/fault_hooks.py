"""Test-only fault injection for ``cli/train_grpo.py``: the plan is built here, from the environment,
so no production code reads test hooks.

``MINDSPEED_RL_TEST_FAULTS`` holds comma-separated items: ``actor:G:A:N`` (actor A of GU G exits
during its N-th minibatch) and ``gu:G:N`` (GU G exits after forwarding N completions).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from mindspeed_rl.workers.generation_unit import FaultPlan

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.trainer.pipeline_inputs import PipelineInputs

FAULTS_ENV = "MINDSPEED_RL_TEST_FAULTS"


def fault_plan(env: Mapping[str, str]) -> FaultPlan:
    actors: dict[tuple[int, int], int] = {}
    gus: dict[int, int] = {}
    for item in filter(None, env.get(FAULTS_ENV, "").split(",")):
        kind, *numbers = item.split(":")
        if not all(n.isdigit() for n in numbers) or (kind, len(numbers)) not in (("actor", 3), ("gu", 2)):
            raise ValueError(f"{FAULTS_ENV}: cannot parse {item!r}; use actor:G:A:N or gu:G:N")
        values = [int(n) for n in numbers]
        if kind == "actor":
            actors[(values[0], values[1])] = values[2]
        else:
            gus[values[0]] = values[1]
    return FaultPlan(actor_dies=actors, gu_dies=gus)


def inputs_with_faults(config: GRPOConfig, run_dir: Path, env: Mapping[str, str]) -> PipelineInputs | None:
    """The production inputs of an async run plus the faults ``env`` asks for; None when it asks none."""
    faults = fault_plan(env)
    if not faults.actor_dies and not faults.gu_dies:
        return None
    if config.rl_config.pipeline != "async":
        raise ValueError(f"{FAULTS_ENV} injects Generation Unit faults; it needs rl_config.pipeline=async")
    from mindspeed_rl.trainer import async_setup, components

    policy_path = str(components.prepare_policy_model(config))
    return async_setup.asp_inputs(config, policy_path, run_dir).with_faults(faults)
