"""Dispatch orders for the scheduling conditions C0–C4, exactly as the offline ablation builds them.

One τ-controlled noisy-oracle prediction vector (per prompt, against the prompt's mean length)
feeds every condition, so differences between conditions come from scheduling alone. Each
condition is a ``Schedule`` from :func:`asp_scheduler.ablation.condition_schedules`, turned into
runtime records by the run's own converter (``scheduled_minibatches``), so batch groups follow
the schedule's ``batch_group_ids`` here exactly as in a training run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.sim.workload import Workload

if TYPE_CHECKING:
    from asp_scheduler.params import ScheduleParams

CONDITIONS = ("C0", "C1", "C2", "C3", "C4")
DEFAULT_TAU = 0.64
"""The paper's predictor quality on Qwen3-30B-A3B (Kendall τ of the noisy oracle)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConditionSchedules:
    schedules: dict[str, list[ScheduledMinibatch]]
    predictions: np.ndarray
    """Predicted length per prompt (workload order), shared by every condition."""
    measured_tau: float


def build_condition_schedules(
    workload: Workload,
    params: ScheduleParams,
    conditions: Sequence[str] = CONDITIONS,
    *,
    tau: float,
) -> ConditionSchedules:
    """The runtime schedule (``ScheduledMinibatch`` list in dispatch order) of each condition.

    ``tau`` is the noisy oracle's Kendall τ (1.0 = exact lengths); ``params.seed`` seeds the
    oracle, C3's shuffle and C4's SA.
    """
    from asp_scheduler.ablation import condition_schedules
    from asp_scheduler.predictors.noisy_oracle import noisy_oracle_predictions
    from mindspeed_rl.datasets.asp_schedule import scheduled_minibatches

    unknown = sorted(set(conditions) - set(CONDITIONS))
    if unknown or not conditions:
        raise ValueError(f"unknown condition(s) {unknown or list(conditions)}; choose from {CONDITIONS}.")
    if params.calibrate_loads:
        raise ValueError(
            "the simulated conditions C0-C4 balance raw predictions; set calibrate_loads false "
            "(calibrated ASP is the offline ablation's C4_calibrated)."
        )
    if workload.num_prompts < params.b:
        raise ValueError(
            f"the workload has {workload.num_prompts} prompts but b={params.b}; lower b or add prompts."
        )
    oracle = noisy_oracle_predictions(workload.prompt_lengths, tau, params.seed)
    built = condition_schedules(oracle.predictions, params, item_ids=list(workload.prompt_ids))
    schedules = {name: list(scheduled_minibatches(built[name])) for name in conditions}
    return ConditionSchedules(
        schedules=schedules, predictions=oracle.predictions, measured_tau=oracle.measured_tau
    )


def schedule_section(data: Mapping[str, Any], *, where: str = "schedule") -> tuple[ScheduleParams, float]:
    """A preset's ``schedule:`` mapping -> (``ScheduleParams``, oracle ``tau``).

    Every ``ScheduleParams`` field is accepted, plus ``tau``; anything else is an error naming the
    valid keys.
    """
    from asp_scheduler.params import ScheduleParams

    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping of field: value, got {type(data).__name__}.")
    known = {f.name for f in fields(ScheduleParams)} | {"tau"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; valid keys: {sorted(known)}.")
    rest = {key: value for key, value in data.items() if key != "tau"}
    return ScheduleParams(**rest), float(data.get("tau", DEFAULT_TAU))
