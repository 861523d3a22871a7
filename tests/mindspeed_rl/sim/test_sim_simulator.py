"""The simulator drives the real ControlLoop: a hand-computed run, determinism, invariants."""

from __future__ import annotations

import numpy as np
import pytest

from asp_scheduler import ScheduleParams
from asp_scheduler.schedule import ordered_schedule
from mindspeed_rl.datasets.asp_schedule import scheduled_minibatches
from mindspeed_rl.runtime import RuntimeConfig
from mindspeed_rl.runtime.events import GlobalBatchPopped, WeightsLoaded
from mindspeed_rl.sim.conditions import build_condition_schedules
from mindspeed_rl.sim.simulator import ClusterShape, Simulator
from mindspeed_rl.sim.timing import DecodeModel, TimingProfile, TrainModel, WeightFlowModel
from mindspeed_rl.sim.workload import SyntheticWorkload, Workload


def _profile(*, per_step: float = 1.0, train: float = 5.0, noise_cv: float = 0.0) -> TimingProfile:
    return TimingProfile(
        decode=DecodeModel(per_step_seconds=per_step, per_token_seconds=0.0),
        train=TrainModel(per_step_seconds=train),
        weight_flow=WeightFlowModel(save_seconds=1.0, convert_seconds=2.0, load_seconds=3.0),
        noise_cv=noise_cv,
    )


def test_one_actor_fixed_times_gives_hand_computed_iterations() -> None:
    # 4 one-prompt minibatches decoding 10, 20, 30, 40 steps at 1 s/step; 1-prompt global batches,
    # train 5 s, save 1 s, convert 2 s, load 3 s. By hand:
    #   mb0 0-10 (v0) -> step0 10-15 -> v1 saved 16, converted 18
    #   mb1 10-30 (v0: v1 not yet converted at 10) -> step1 30-35 -> v2 converted 38
    #   reload 30-33 (v1), mb2 33-63 -> step2 63-68;  reload 63-66 (v2), mb3 66-106 -> step3 106-111
    workload = Workload(
        prompt_ids=("a", "b", "c", "d"), lengths=np.array([[10], [20], [30], [40]]), source="t"
    )
    one_each = ordered_schedule(
        np.ones(4),
        [np.array([i]) for i in range(4)],
        ScheduleParams(b=1, kappa=0, k=1),
        item_ids=workload.prompt_ids,
    )
    schedule = scheduled_minibatches(one_each)
    runtime = RuntimeConfig(
        num_prompts_per_global_batch=1,
        num_samples_per_prompt=1,
        queue_max_samples=2,
        queue_resume_samples=0,
        max_policy_lag=None,
    )
    sim = Simulator(
        runtime=runtime,
        cluster=ClusterShape(num_generation_units=1, actors_per_gu=1),
        profile=_profile(),
        workload=workload,
        schedule=schedule,
        check_invariants=True,
    )
    result = sim.run()
    assert result.iteration_seconds.tolist() == [15.0, 20.0, 33.0, 43.0]
    assert sim.clock.now() == 111.0
    assert [(e.time, e.version) for e in result.events.of_type(WeightsLoaded)] == [(33.0, 1), (66.0, 2)]
    assert [e.d_off_max for e in result.events.of_type(GlobalBatchPopped)] == [0, 1, 1, 1]
    assert result.lag.d_off_measured_mean == pytest.approx(0.75)
    assert result.duty_cycle == pytest.approx(100.0 / 106.0)
    assert result.table4b.queue_max_samples == 1
    assert result.table4b.mean_iteration_seconds == pytest.approx(111.0 / 4)
    assert result.table4b.iteration_trend_spearman == pytest.approx(1.0)


def _random_run(seed: int, *, max_policy_lag: int | None = 2) -> Simulator:
    workload = SyntheticWorkload(num_prompts=96, num_samples_per_prompt=2, median_tokens=60).draw(0)
    built = build_condition_schedules(
        workload, ScheduleParams(b=4, kappa=1, k=3, sa_iterations=2000), tau=0.7
    )
    runtime = RuntimeConfig(
        num_prompts_per_global_batch=8,
        num_samples_per_prompt=2,
        queue_max_samples=32,
        queue_resume_samples=16,
        gu_queue_low=1,
        gu_queue_high=3,
        max_policy_lag=max_policy_lag,
    )
    return Simulator(
        runtime=runtime,
        cluster=ClusterShape(num_generation_units=2, actors_per_gu=3),
        profile=_profile(per_step=0.2, train=6.0, noise_cv=0.2),
        workload=workload,
        schedule=built.schedules["C4"],
        seed=seed,
        check_invariants=True,
    )


def test_runs_are_deterministic_per_seed() -> None:
    a, b, c = (_random_run(s).run() for s in (3, 3, 4))
    assert np.array_equal(a.iteration_seconds, b.iteration_seconds)
    assert a.table4b == b.table4b
    assert not np.array_equal(a.iteration_seconds, c.iteration_seconds)


def test_invariants_hold_and_every_sample_is_consumed_once() -> None:
    sim = _random_run(0)
    result = sim.run()
    sim.loop.check_invariants()
    s = result.summary
    assert s.prompts_consumed == s.prompts_scheduled == 96
    assert sum(e.num_samples for e in result.events.of_type(GlobalBatchPopped)) == 96 * 2
    assert s.max_policy_lag_measured is not None and s.max_policy_lag_measured <= 2
    # Backpressure bounds the queue: beyond Q_max only already-running minibatches can land.
    running_bound = 6 * (4 + 1) * 2
    assert result.table4b.queue_max_samples <= 32 + running_bound
    assert result.queue.depth_samples[-1] == 0


def test_sample_count_mismatch_is_rejected() -> None:
    workload = Workload(prompt_ids=("a",), lengths=np.array([[3, 4]]), source="t")
    runtime = RuntimeConfig(
        num_prompts_per_global_batch=1, num_samples_per_prompt=1, queue_max_samples=2, queue_resume_samples=0
    )
    with pytest.raises(ValueError, match="samples per prompt"):
        Simulator(
            runtime=runtime,
            cluster=ClusterShape(num_generation_units=1, actors_per_gu=1),
            profile=_profile(),
            workload=workload,
            schedule=scheduled_minibatches(
                ordered_schedule(
                    np.ones(1), [np.array([0])], ScheduleParams(b=1, k=1), item_ids=workload.prompt_ids
                )
            ),
        )
