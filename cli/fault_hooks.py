"""Test-only fault injection for ``cli/train_grpo.py``: the fault plan is built here, from the
environment, so no production code reads test hooks.

``MINDSPEED_RL_TEST_FAULTS`` holds comma-separated items: ``actor:G:A:N`` (actor A of GU G exits
during its N-th minibatch), ``hang:G:A:N`` (it hangs there), ``raise:G:A:N`` (generate raises
there; ``N = *``: on every minibatch), ``eval-exit:G:A:N`` / ``eval-hang:G:A:N`` (actor A of GU G
exits / hangs during its N-th evaluation decode) and ``gu:G:N`` (GU G exits after forwarding N
completions). An actor slot's minibatches and decodes are counted across its replacements, so one
item fires once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from mindspeed_rl.workers.fault_plan import FaultPlan

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig

FAULTS_ENV = "MINDSPEED_RL_TEST_FAULTS"


_ACTOR_KINDS = {"actor": "exit", "hang": "hang", "raise": "raise"}
_EVAL_KINDS = {"eval-exit": "exit", "eval-hang": "hang"}
_USAGE = (
    "use actor:G:A:N, hang:G:A:N, raise:G:A:N (N may be * for raise), eval-exit:G:A:N, eval-hang:G:A:N "
    "or gu:G:N"
)


def fault_plan(env: Mapping[str, str]) -> FaultPlan:
    actors: dict[tuple[int, int], dict[int, str]] = {}
    evals: dict[tuple[int, int], dict[int, str]] = {}
    gus: dict[int, int] = {}
    for item in filter(None, env.get(FAULTS_ENV, "").split(",")):
        kind, *fields = item.split(":")
        every = kind == "raise" and len(fields) == 3 and fields[2] == "*"
        numbers = fields[:2] if every else fields
        arity = 2 if kind == "gu" else 3
        known = (*_ACTOR_KINDS, *_EVAL_KINDS, "gu")
        if kind not in known or len(fields) != arity or not all(n.isdigit() for n in numbers):
            raise ValueError(f"{FAULTS_ENV}: cannot parse {item!r}; {_USAGE}")
        values = [int(n) for n in numbers]
        if kind == "gu":
            gus[values[0]] = values[1]
            continue
        n = 0 if every else values[2]
        if n < 1 and not every:
            raise ValueError(f"{FAULTS_ENV}: {item!r} counts minibatches from 1; {_USAGE}")
        if kind in _EVAL_KINDS:
            evals.setdefault((values[0], values[1]), {})[n] = _EVAL_KINDS[kind]
        else:
            actors.setdefault((values[0], values[1]), {})[n] = _ACTOR_KINDS[kind]
    return FaultPlan(actor_faults=actors, eval_faults=evals, gu_dies=gus)


def faults_from_env(config: GRPOConfig, env: Mapping[str, str]) -> FaultPlan | None:
    """The faults ``env`` asks the async run to inject; None when it asks none."""
    faults = fault_plan(env)
    if not faults.actor_faults and not faults.eval_faults and not faults.gu_dies:
        return None
    if config.rl_config.pipeline != "async":
        raise ValueError(f"{FAULTS_ENV} injects Generation Unit faults; it needs rl_config.pipeline=async")
    return faults
