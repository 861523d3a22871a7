"""Run a preset: one simulation per scheduling condition, plus the profile's analytic checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from mindspeed_rl.runtime import ScheduledMinibatch
from mindspeed_rl.sim.conditions import CONDITIONS, build_condition_schedules
from mindspeed_rl.sim.preset import SimPreset
from mindspeed_rl.sim.result import SimResult
from mindspeed_rl.sim.simulator import ClusterShape, Simulator
from mindspeed_rl.sim.table4b import table4b_row
from mindspeed_rl.sim.timing import TimingProfile
from mindspeed_rl.sim.workload import Workload


def eq4_constant(profile: TimingProfile, t_gen_seconds: float) -> float:
    """``(T_save + T_convert + T_load + T_gen) / T_train`` with the profile's fixed train time."""
    t_train = profile.train.per_step_seconds
    if t_train <= 0:
        raise ValueError("Eq. 4 needs a fixed train time; set profile.train.per_step_seconds > 0.")
    return (profile.weight_flow.delay_seconds + t_gen_seconds) / t_train


def duty_cycle_estimate(profile: TimingProfile, t_gen_seconds: float) -> float:
    """App. D.6: ``η ≈ T_gen / (T_gen + T_load)``."""
    return t_gen_seconds / (t_gen_seconds + profile.weight_flow.load_seconds)


def simulate_schedule(
    preset: SimPreset,
    workload: Workload,
    schedule: Sequence[ScheduledMinibatch],
    *,
    label: str,
    cluster: ClusterShape | None = None,
    check_invariants: bool = False,
) -> SimResult:
    sim = Simulator(
        runtime=preset.runtime_config(workload.num_samples_per_prompt),
        cluster=cluster or preset.cluster,
        profile=preset.profile,
        workload=workload,
        schedule=schedule,
        seed=preset.seed,
        label=label,
        check_invariants=check_invariants,
    )
    return sim.run()


@dataclass(frozen=True, slots=True, kw_only=True)
class ConditionsReport:
    preset: str
    workload: str
    measured_tau: float
    results: dict[str, SimResult]
    skip_first: int

    def rows(self) -> list[Any]:
        return [
            table4b_row(list(r.events), condition=name, start_time=0.0, skip_first=self.skip_first)
            for name, r in self.results.items()
        ]

    def to_dict(self, *, include_series: bool = False) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "workload": self.workload,
            "measured_tau": self.measured_tau,
            "skip_first": self.skip_first,
            "table4b": [row.to_dict() for row in self.rows()],
            "runs": {name: r.to_dict(include_series=include_series) for name, r in self.results.items()},
        }


def simulate_conditions(
    preset: SimPreset,
    workload: Workload,
    conditions: Sequence[str] = CONDITIONS,
    *,
    skip_first: int = 0,
    check_invariants: bool = False,
) -> ConditionsReport:
    """Build C0–C4 (same predictions for all) and simulate each on the preset's cluster."""
    built = build_condition_schedules(workload, preset.schedule, conditions, tau=preset.tau)
    results = {
        name: simulate_schedule(preset, workload, schedule, label=name, check_invariants=check_invariants)
        for name, schedule in built.schedules.items()
    }
    return ConditionsReport(
        preset=preset.name,
        workload=workload.source,
        measured_tau=built.measured_tau,
        results=results,
        skip_first=skip_first,
    )


def with_cluster(
    preset: SimPreset, *, num_generation_units: int | None = None, actors_per_gu: int | None = None
) -> SimPreset:
    cluster = ClusterShape(
        num_generation_units=preset.cluster.num_generation_units
        if num_generation_units is None
        else num_generation_units,
        actors_per_gu=preset.cluster.actors_per_gu if actors_per_gu is None else actors_per_gu,
    )
    return replace(preset, cluster=cluster)
