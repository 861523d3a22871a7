"""Project iteration time against generation capacity (the paper's Fig. 2b, for one TU size).

Each point simulates the same workload and schedule with more GUs; next to it, the planner's
steady-rate prediction ``max(T_train, P / (A · r))`` says which side should be the bottleneck.
Adding actors first cuts the iteration time roughly as ``1 / A`` (generation-bound), then the
curve flattens at about ``T_train`` once the TU becomes the bottleneck.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mindspeed_rl.runtime import ScheduledMinibatch
from mindspeed_rl.sim.planner import PlannerInputs, TrainingUnitOption, plan_for
from mindspeed_rl.sim.preset import SimPreset
from mindspeed_rl.sim.runner import simulate_schedule, with_cluster
from mindspeed_rl.sim.workload import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingPoint:
    num_generation_units: int
    num_actors: int
    mean_iteration_seconds: float
    """Simulated, warm-up iterations excluded."""
    predicted_iteration_seconds: float
    bottleneck: str
    """The planner's call: ``generation``, ``training`` or ``balanced``."""
    queue_max_samples: int
    seconds_paused: float
    d_off_measured_mean: float | None
    q_arrival_mean_global_batches: float
    duty_cycle: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def project_scaling(
    preset: SimPreset,
    workload: Workload,
    schedule: Sequence[ScheduledMinibatch],
    gu_counts: Sequence[int],
    *,
    skip_first: int = 1,
) -> list[ScalingPoint]:
    points = []
    for num_generation_units in gu_counts:
        shaped = with_cluster(preset, num_generation_units=num_generation_units)
        result = simulate_schedule(shaped, workload, schedule, label=f"{num_generation_units} GU")
        iters = result.iteration_seconds[skip_first:]
        if iters.size == 0:
            raise ValueError(f"skip_first={skip_first} leaves no iterations; use a longer workload.")
        actors = shaped.cluster.num_actors
        per_minibatch = workload.num_prompts / len(schedule)
        plan = plan_for(
            _planner_inputs(shaped, per_minibatch, result.mean_gen_seconds, actors), _tu(shaped), actors
        )
        points.append(
            ScalingPoint(
                num_generation_units=num_generation_units,
                num_actors=actors,
                mean_iteration_seconds=float(iters.mean()),
                predicted_iteration_seconds=plan.iteration_seconds,
                bottleneck=plan.bottleneck,
                queue_max_samples=result.table4b.queue_max_samples,
                seconds_paused=result.summary.seconds_paused,
                d_off_measured_mean=result.lag.d_off_measured_mean,
                q_arrival_mean_global_batches=result.lag.q_arrival_mean_global_batches,
                duty_cycle=result.duty_cycle,
            )
        )
    return points


def _tu(preset: SimPreset) -> TrainingUnitOption:
    # Devices are not modeled here: one device per actor and a 1-device TU, so the plan always fits.
    return TrainingUnitOption(num_devices=1, train_seconds=preset.profile.train.per_step_seconds)


def _planner_inputs(
    preset: SimPreset, prompts_per_minibatch: float, gen_seconds: float, actors: int
) -> PlannerInputs:
    wf = preset.profile.weight_flow
    return PlannerInputs(
        total_devices=1 + actors,
        training_options=(_tu(preset),),
        actor_devices=1,
        gen_seconds=gen_seconds,
        prompts_per_minibatch=prompts_per_minibatch,
        num_prompts_per_global_batch=int(preset.runtime["num_prompts_per_global_batch"]),
        load_seconds=wf.load_seconds,
        save_seconds=wf.save_seconds,
        convert_seconds=wf.convert_seconds,
    )
