"""Check an allocation plan with a short simulation (fixed per-minibatch times, no length model).

The planner's arithmetic assumes steady rates; the simulation adds what it leaves out — warm-up,
batch-group dispatch, reload timing, backpressure — and reports the steady-state iteration time
(mean over the second half of the iterations) next to the prediction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mindspeed_rl.runtime import RuntimeConfig, ScheduledMinibatch
from mindspeed_rl.sim.planner import AllocationPlan, PlannerInputs
from mindspeed_rl.sim.simulator import ClusterShape, Simulator
from mindspeed_rl.sim.timing import DecodeModel, TimingProfile, TrainModel, WeightFlowModel
from mindspeed_rl.sim.workload import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanCheck:
    predicted_iteration_seconds: float
    simulated_iteration_seconds: float
    """Mean over the second half of the simulated iterations (warm-up excluded)."""
    queue_max_samples: int
    d_off_measured_mean: float | None
    num_iterations: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify_plan(
    plan: AllocationPlan, inputs: PlannerInputs, *, num_iterations: int = 40, seed: int = 0
) -> PlanCheck:
    m = inputs.prompts_per_minibatch
    if m != int(m):
        raise ValueError(
            f"verification schedules whole minibatches, but prompts_per_minibatch={m}; pass an integer."
        )
    if num_iterations < 4:
        raise ValueError(f"num_iterations must be >= 4 to have a steady-state half, got {num_iterations}.")
    p = inputs.num_prompts_per_global_batch
    ids = tuple(f"q{i}" for i in range(num_iterations * p))
    workload = Workload(prompt_ids=ids, lengths=np.ones((len(ids), 1), dtype=np.int64), source="plan check")
    schedule = [
        ScheduledMinibatch(
            minibatch_id=j,
            prompt_ids=ids[start : start + int(m)],
            batch_group_id=j,
            predicted_load=float(len(ids[start : start + int(m)])),
            order_index=j,
        )
        for j, start in enumerate(range(0, len(ids), int(m)))
    ]
    profile = TimingProfile(
        decode=DecodeModel(
            per_step_seconds=0.0, per_token_seconds=0.0, per_minibatch_seconds=inputs.gen_seconds
        ),
        train=TrainModel(per_step_seconds=plan.train_seconds),
        weight_flow=WeightFlowModel(
            save_seconds=inputs.save_seconds,
            convert_seconds=inputs.convert_seconds,
            load_seconds=inputs.load_seconds,
        ),
    )
    runtime = RuntimeConfig(
        num_prompts_per_global_batch=p,
        num_samples_per_prompt=1,
        queue_max_samples=4 * p,
        queue_resume_samples=2 * p,
        max_policy_lag=None,
    )
    result = Simulator(
        runtime=runtime,
        cluster=ClusterShape(num_generation_units=plan.num_actors, actors_per_gu=1),
        profile=profile,
        workload=workload,
        schedule=schedule,
        seed=seed,
        label="plan check",
    ).run()
    iters = result.iteration_seconds
    return PlanCheck(
        predicted_iteration_seconds=plan.iteration_seconds,
        simulated_iteration_seconds=float(iters[iters.size // 2 :].mean()),
        queue_max_samples=result.table4b.queue_max_samples,
        d_off_measured_mean=result.lag.d_off_measured_mean,
        num_iterations=int(iters.size),
    )
