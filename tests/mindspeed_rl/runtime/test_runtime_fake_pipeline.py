"""End-to-end invariants of the control logic, driven by a fake event-driven pipeline.

Randomized with fixed seeds (hypothesis-style, without hypothesis): several GU/actor layouts,
random generation times, lag bounds and queue limits, with and without faults.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from runtime_fake_pipeline import FakePipeline, Fault, Observed, Setup
from runtime_fakes import make_config, make_schedule

from mindspeed_rl.runtime import RuntimeConfig, ScheduledMinibatch
from mindspeed_rl.runtime.events import MinibatchIssued, MinibatchRequeued


def _check_run(pipe: FakePipeline, schedule: list[ScheduledMinibatch], obs: Observed) -> None:
    config, loop = pipe.config, pipe.loop
    scheduled = [p for mb in schedule for p in mb.prompt_ids]
    owner = {p: mb.minibatch_id for mb in schedule for p in mb.prompt_ids}
    consumed = [g.prompt_id for b in obs.batches for g in b.prompts]
    # Every scheduled prompt consumed exactly once.
    assert Counter(consumed) == Counter(scheduled)
    assert loop.is_finished()
    for step, batch in enumerate(obs.batches):
        assert batch.step == step
        if step < len(obs.batches) - 1:
            assert batch.num_prompts == config.num_prompts_per_global_batch
        for group in batch.prompts:
            # All n samples of a prompt together, from the minibatch the schedule put it in.
            assert sorted(s.sample_index for s in group.samples) == list(range(config.num_samples_per_prompt))
            assert {s.minibatch_id for s in group.samples} == {owner[group.prompt_id]}
            assert {s.prompt_id for s in group.samples} == {group.prompt_id}
            if config.max_policy_lag is not None:
                assert all(step - s.policy_version <= config.max_policy_lag for s in group.samples)
    # No minibatch started while (our own model of) the pause was on, nor above Q_max.
    assert all(not paused and depth <= config.queue_max_samples for _, _, depth, paused in obs.starts)
    assert obs.depth_violations == []
    num_actors = pipe.setup.num_generation_units * pipe.setup.actors_per_gu
    biggest = max(mb.num_prompts for mb in schedule) * config.num_samples_per_prompt
    assert obs.max_depth <= config.queue_max_samples + num_actors * biggest
    summary = loop.summary()
    assert summary.prompts_consumed == summary.prompts_scheduled == len(scheduled)
    assert summary.max_queue_depth_samples == obs.max_depth
    measured = max(b.step - s.policy_version for b in obs.batches for s in b.samples)
    assert summary.max_policy_lag_measured == measured
    _check_dispatch_order(pipe, schedule)


def _check_dispatch_order(pipe: FakePipeline, schedule: list[ScheduledMinibatch]) -> None:
    """First issues follow the schedule; a re-queued minibatch is re-issued before new work."""
    order = {mb.minibatch_id: mb.order_index for mb in schedule}
    first_issues = [e.minibatch_id for e in pipe.loop.events.of_type(MinibatchIssued) if e.attempt == 0]
    assert [order[i] for i in first_issues] == sorted(order[i] for i in first_issues)
    waiting: set[int] = set()
    for event in pipe.loop.events:
        if isinstance(event, MinibatchRequeued):
            waiting.add(event.minibatch_id)
        elif isinstance(event, MinibatchIssued):
            assert event.attempt > 0 or not waiting, f"new work {event.minibatch_id} issued before re-issues"
            waiting.discard(event.minibatch_id)


def _random_case(seed: int) -> tuple[RuntimeConfig, list[ScheduledMinibatch], Setup]:
    rng = random.Random(seed)
    n = rng.choice([1, 2, 4])
    prompts_per_batch = rng.choice([3, 4, 6])
    lag = rng.choice([1, 2, 3, None])
    low = rng.randint(0, 2)
    q_max = prompts_per_batch * n * rng.choice([1, 2, 3])
    config = make_config(
        num_prompts_per_global_batch=prompts_per_batch,
        num_samples_per_prompt=n,
        queue_max_samples=q_max,
        queue_resume_samples=rng.randint((prompts_per_batch - 1) * n, q_max - 1),
        gu_queue_low=low,
        gu_queue_high=low + rng.randint(1, 4),
        max_policy_lag=lag,
    )
    largest = prompts_per_batch + 1 if lag is None else min(lag * prompts_per_batch + 1, 4)
    schedule = make_schedule(
        rng.randint(20, 50), prompts_per_minibatch=(1, largest), group_size=rng.randint(2, 5), seed=seed
    )
    setup = Setup(
        num_generation_units=rng.randint(1, 3),
        actors_per_gu=rng.randint(1, 3),
        gen_seconds=(0.5, rng.choice([2.0, 8.0])),
        train_seconds=rng.choice([0.5, 2.0, 6.0]),
        gu_checks_pause=rng.random() < 0.7,
        seed=seed,
    )
    return config, schedule, setup


@pytest.mark.parametrize("seed", range(24))
def test_random_pipelines_keep_every_invariant(seed: int) -> None:
    config, schedule, setup = _random_case(seed)
    pipe = FakePipeline(config, schedule, setup)
    _check_run(pipe, schedule, pipe.run())


@pytest.mark.parametrize("seed", range(6))
def test_partial_rollouts_keep_every_invariant_and_count_from_the_oldest_token(seed: int) -> None:
    config, schedule, setup = _random_case(seed)
    setup.partial_max_split = 3
    setup.gen_seconds = (2.0, 12.0)  # long generations, so refreshes reach them mid-way
    if setup.num_generation_units * setup.actors_per_gu > 1:  # a partial minibatch killed mid-way
        setup.faults = [Fault(time=6.0, gu_id=0, actor_id=0, late_delay=1.0)]
    pipe = FakePipeline(config, schedule, setup)
    obs = pipe.run()
    _check_run(pipe, schedule, obs)  # exactly once, lag bound from policy_version, queue bound
    samples = [s for b in obs.batches for s in b.samples]
    split = [s for s in samples if s.segments]
    assert split, "no minibatch crossed a refresh: the case tests nothing"
    assert all(s.segments[0].version == s.policy_version and s.num_segments <= 3 for s in split)
    lag = pipe.loop.lag
    assert lag.partial_samples_total == len(split)
    assert lag.partial_segments_total == sum(s.num_segments for s in split)
    assert lag.max_segments_per_sample == max(s.num_segments for s in split)


def test_slow_trainer_triggers_backpressure_and_hysteresis() -> None:
    config = make_config(queue_max_samples=16, queue_resume_samples=6, max_policy_lag=None)
    schedule = make_schedule(40, seed=3)
    pipe = FakePipeline(
        config,
        schedule,
        Setup(num_generation_units=2, actors_per_gu=3, gen_seconds=(0.5, 1.0), train_seconds=8),
    )
    obs = pipe.run()
    _check_run(pipe, schedule, obs)
    summary = pipe.loop.summary()
    assert summary.num_backpressure_pauses >= 2
    assert summary.seconds_paused > 0
    assert summary.max_queue_depth_samples > config.queue_max_samples  # running ones still land


def test_tight_lag_bound_holds_when_stragglers_finish_last() -> None:
    # Very spread generation times make late arrivals from old versions common.
    config = make_config(max_policy_lag=1, queue_max_samples=40, queue_resume_samples=20)
    schedule = make_schedule(40, prompts_per_minibatch=(1, 3), seed=5)
    pipe = FakePipeline(
        config, schedule, Setup(num_generation_units=3, actors_per_gu=3, gen_seconds=(0.2, 20.0), seed=5)
    )
    obs = pipe.run()
    _check_run(pipe, schedule, obs)
    assert pipe.loop.summary().max_policy_lag_measured == 1


@pytest.mark.parametrize("late_delay", [None, 0.5, 500.0])
def test_actor_failure_mid_minibatch_loses_and_duplicates_nothing(late_delay: float | None) -> None:
    config = make_config()
    schedule = make_schedule(30, seed=7)
    setup = Setup(
        gen_seconds=(2.0, 4.0), faults=[Fault(time=1.0, gu_id=0, actor_id=1, late_delay=late_delay)]
    )
    pipe = FakePipeline(config, schedule, setup)
    obs = pipe.run()
    _check_run(pipe, schedule, obs)
    summary = pipe.loop.summary()
    assert obs.num_killed_running == 1
    assert summary.minibatches_reissued == 1
    if late_delay == 500.0:  # arrives after the re-issue completed: dropped as a duplicate
        assert summary.duplicate_minibatches_dropped >= 1
    elif late_delay == 0.5:  # arrives while the re-issue is pending: dropped as superseded
        assert summary.superseded_completions_dropped >= 1
    else:
        assert summary.duplicate_minibatches_dropped == summary.superseded_completions_dropped == 0


@pytest.mark.parametrize("late_delay", [None, 0.5, 500.0])
def test_gu_failure_reissues_queued_and_running_work(late_delay: float | None) -> None:
    config = make_config(gu_queue_low=2, gu_queue_high=4)
    schedule = make_schedule(36, seed=11)
    setup = Setup(
        num_generation_units=3,
        gen_seconds=(2.0, 4.0),
        faults=[Fault(time=1.0, gu_id=1, late_delay=late_delay)],
    )
    pipe = FakePipeline(config, schedule, setup)
    obs = pipe.run()
    _check_run(pipe, schedule, obs)
    summary = pipe.loop.summary()
    assert obs.num_killed_running >= 1
    assert summary.minibatches_reissued > obs.num_killed_running  # its queue was re-issued too
    dropped = summary.duplicate_minibatches_dropped + summary.superseded_completions_dropped
    assert dropped == (0 if late_delay is None else obs.num_killed_running)


def test_random_faults_never_lose_or_duplicate() -> None:
    for seed in range(8):
        config, schedule, setup = _random_case(100 + seed)
        rng = random.Random(seed)
        setup.num_generation_units, setup.actors_per_gu = 3, 2
        setup.faults = [
            Fault(
                time=rng.uniform(1, 10),
                gu_id=0,
                actor_id=rng.randint(0, 1),
                late_delay=rng.choice([None, 1.0]),
            ),
            Fault(time=rng.uniform(5, 20), gu_id=2, late_delay=rng.choice([None, 300.0])),
        ]
        pipe = FakePipeline(config, schedule, setup)
        _check_run(pipe, schedule, pipe.run())


def test_trimming_the_history_each_step_bounds_it_and_changes_no_figure() -> None:
    """The Ray CU forgets arrival and lag records its digest has read; whole-run figures are
    running aggregates, so they equal those of a run that kept everything."""
    config = make_config(max_policy_lag=2)
    schedule = make_schedule(40, seed=11)
    kept = FakePipeline(config, schedule, Setup(num_generation_units=2, actors_per_gu=3, seed=11))
    kept.run()
    trimmed = FakePipeline(
        config, schedule, Setup(num_generation_units=2, actors_per_gu=3, seed=11, trim_history=True)
    )
    _check_run(trimmed, schedule, trimmed.run())
    assert trimmed.loop.summary() == kept.loop.summary()
    assert len(trimmed.loop.lag.steps) == len(kept.loop.lag.steps) > 5  # positions count everything
    assert len(list(trimmed.loop.lag.steps)) == 0 < len(list(kept.loop.lag.steps))
    assert len(list(trimmed.loop.queue.arrivals)) < len(list(kept.loop.queue.arrivals)) / 4
    with pytest.raises(ValueError, match="were trimmed"):
        trimmed.loop.observe(arrivals_since=0)
