"""Dispatch orders for the scheduling conditions C0–C4, exactly as the offline ablation builds them.

One τ-controlled noisy-oracle prediction vector (per prompt, against the prompt's mean length)
feeds every condition, so differences between conditions come from scheduling alone. Batch groups
are ``k`` consecutive minibatches of the dispatch order in every condition: the Sender deals whole
groups, which is what C4's balanced ordering is optimized for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.sim.workload import Workload

CONDITIONS = ("C0", "C1", "C2", "C3", "C4")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSettings:
    """The scheduler knobs (paper defaults b=32, κ=2, k=6; batch sizes in prompts)."""

    b: int = 32
    kappa: int = 2
    k: int = 6
    tau: float = 0.64
    """Kendall τ of the noisy-oracle predictions (1.0 = exact lengths)."""
    sa_iterations: int = 2_000_000
    seed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ConditionSchedules:
    schedules: dict[str, list[ScheduledMinibatch]]
    predictions: np.ndarray
    """Predicted length per prompt (workload order), shared by every condition."""
    measured_tau: float


def build_condition_schedules(
    workload: Workload, settings: ScheduleSettings, conditions: Sequence[str] = CONDITIONS
) -> ConditionSchedules:
    """The runtime schedule (``ScheduledMinibatch`` list in dispatch order) of each condition."""
    from asp_scheduler.ablation import AblationConfig, condition_minibatches
    from asp_scheduler.predictors.noisy_oracle import noisy_oracle_predictions

    unknown = sorted(set(conditions) - set(CONDITIONS))
    if unknown or not conditions:
        raise ValueError(f"unknown condition(s) {unknown or list(conditions)}; choose from {CONDITIONS}.")
    if workload.num_prompts < settings.b:
        raise ValueError(
            f"the workload has {workload.num_prompts} prompts but b={settings.b}; lower b or add prompts."
        )
    oracle = noisy_oracle_predictions(workload.prompt_lengths, settings.tau, settings.seed)
    cfg = AblationConfig(
        b=settings.b, kappa=settings.kappa, k=settings.k, sa_iterations=settings.sa_iterations
    )
    index_lists = condition_minibatches(oracle.predictions, cfg, settings.seed)
    schedules = {
        name: to_scheduled(index_lists[name], workload, oracle.predictions, settings.k) for name in conditions
    }
    return ConditionSchedules(
        schedules=schedules, predictions=oracle.predictions, measured_tau=oracle.measured_tau
    )


def to_scheduled(
    minibatches: Sequence[np.ndarray], workload: Workload, predictions: np.ndarray, k: int
) -> list[ScheduledMinibatch]:
    """Index arrays (dispatch order) -> runtime records; groups are ``k`` consecutive minibatches."""
    out = []
    for position, rows in enumerate(minibatches):
        out.append(
            ScheduledMinibatch(
                minibatch_id=position,
                prompt_ids=tuple(workload.prompt_ids[int(r)] for r in rows),
                batch_group_id=position // k,
                predicted_load=float(predictions[rows].sum()),
                order_index=position,
            )
        )
    covered = sum(mb.num_prompts for mb in out)
    assert covered == workload.num_prompts, f"schedule covers {covered} of {workload.num_prompts} prompts"
    return out
