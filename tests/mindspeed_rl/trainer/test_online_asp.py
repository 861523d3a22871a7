"""Online ASP hook driven through the real ControlLoop: feedback, refit, re-plan, starvation."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from asp_scheduler.params import ScheduleParams
from mindspeed_rl.config_cls import ASPConfig
from mindspeed_rl.datasets.prompt_alias import pass_alias, prompt_of
from mindspeed_rl.runtime import ControlLoop, FakeClock, RuntimeConfig, ScheduledMinibatch
from mindspeed_rl.runtime.records import CompletedMinibatch, Sample
from mindspeed_rl.runtime.replan import ReplanOutcome
from mindspeed_rl.trainer.checkpointing import remaining_schedule, schedule_from_json, schedule_to_json
from mindspeed_rl.trainer.online_asp import OnlineAsp, carry_schedule, online_hook

N = 2  # samples per prompt


def _schedule(num_prompts: int, b: int) -> list[ScheduledMinibatch]:
    return [
        ScheduledMinibatch(
            minibatch_id=i,
            prompt_ids=tuple(f"p{j}" for j in range(i * b, (i + 1) * b)),
            batch_group_id=i // 2,
            predicted_load=float(b * 10),
            order_index=i,
        )
        for i in range(num_prompts // b)
    ]


def _true_length(prompt: str) -> int:
    return 1 + int(prompt[1:]) % 17  # lengths the prior (a flat 10) knows nothing about


def _completed(mb: ScheduledMinibatch, attempt: int, version: int, now: float) -> CompletedMinibatch:
    samples = tuple(
        Sample(
            prompt_id=p,
            sample_index=i,
            minibatch_id=mb.minibatch_id,
            response_token_ids=tuple(range(_true_length(p))),
            rollout_log_probs=tuple(-0.1 for _ in range(_true_length(p))),
            reward=1.0,
            policy_version=version,
            gu_id=0,
            actor_id=0,
            sent_at=now,
        )
        for p in mb.prompt_ids
        for i in range(N)
    )
    return CompletedMinibatch(
        minibatch_id=mb.minibatch_id,
        attempt=attempt,
        samples=samples,
        gu_id=0,
        actor_id=0,
        policy_version=version,
        started_at=now,
        finished_at=now + 1.0,
    )


def _run(
    hook: OnlineAsp, schedule: Sequence[ScheduledMinibatch], *, max_steps: int | None = None
) -> tuple[ControlLoop, list[dict[str, float]], list[str]]:
    clock = FakeClock()
    config = RuntimeConfig(
        num_prompts_per_global_batch=8,
        num_samples_per_prompt=N,
        queue_max_samples=64,
        queue_resume_samples=32,
        gu_queue_low=1,
        gu_queue_high=2,
        max_policy_lag=None,  # this fake actor never reloads
    )
    loop = ControlLoop(config=config, schedule=schedule, clock=clock)
    hook.on_scheduled(schedule, clock.now())
    loop.register_gu(0, num_actors=1)
    queue, step, metrics, consumed = list(loop.dispatch()), 0, [], []
    while not loop.is_finished() and step != max_steps:
        if queue:
            a = queue.pop(0)
            assert loop.request_start(a.minibatch.minibatch_id, attempt=a.attempt, gu_id=0, actor_id=0,
                                      policy_version=0).granted  # fmt: skip
            clock.advance(1.0)
            completed = _completed(a.minibatch, a.attempt, 0, clock.now())
            loop.on_minibatch_completed(completed)
            hook.observe(completed)
        if (batch := loop.pop_global_batch(step)) is not None:
            hook.on_consumed(batch, clock.now())
            consumed += batch.prompt_ids
            loop.on_train_step_done(step)
            metrics.append(hook.after_step(step, loop.replan_unsent))
            step += 1
        queue += loop.dispatch()
        loop.check_invariants()
    return loop, metrics, consumed


def test_hook_refits_replans_and_consumes_every_prompt_once() -> None:
    schedule = _schedule(96, b=4)
    prior = {p: 10.0 for mb in schedule for p in mb.prompt_ids}
    hook = OnlineAsp(prior, ScheduleParams(b=4, kappa=0, k=2, sa_iterations=2000), recency_window=16)
    loop, metrics, _ = _run(hook, schedule)
    assert loop.prompts_consumed == 96
    summary = hook.summary()
    assert summary["schedule_replans"] >= 1 and summary["replan_wall_s_max"] > 0
    assert any("asp/replan_wall_s" in m for m in metrics)
    assert any(m.get("asp/prior_pairs", 0) >= 8 for m in metrics)
    assert any("asp/prior_mae_tokens" in m for m in metrics)
    starvation = summary["starvation"]
    assert starvation["num_prompts"] == 96 and len(starvation["by_length_quintile"]) == 5
    quintiles = starvation["by_length_quintile"]
    assert quintiles[0]["length_max"] <= quintiles[-1]["length_min"]
    # No starvation: the longest fifth waits at most 1.5x as long as the shortest, on average.
    assert starvation["longest_to_shortest_mean_wait"] < 1.5
    assert starvation["trained_length"]["mean"] == pytest.approx(
        sum(_true_length(f"p{i}") for i in range(96)) / 96
    )


def test_online_hook_is_off_unless_asked_and_checks_its_keys(tmp_path) -> None:
    schedule = _schedule(16, b=4)
    assert online_hook(ASPConfig(), schedule, tmp_path) is None
    hook = online_hook(ASPConfig(online=True, b=4, kappa=0, k=2), schedule, tmp_path)
    assert isinstance(hook, OnlineAsp) and hook.predictor.estimates(["p3"])[0] == 10.0
    with pytest.raises(ValueError, match="asp_config.replan_interval must be an integer >= 1"):
        online_hook(dataclasses.replace(ASPConfig(online=True), replan_interval=0), schedule, tmp_path)


def test_resume_continues_the_replanned_schedule_and_consumes_each_prompt_once() -> None:
    schedule = _schedule(96, b=4)
    prior = {p: 10.0 for mb in schedule for p in mb.prompt_ids}
    params = ScheduleParams(b=4, kappa=0, k=2, sa_iterations=2000)
    first = OnlineAsp(prior, params, recency_window=16)
    loop, _, consumed = _run(first, schedule, max_steps=5)
    assert first.summary()["schedule_replans"] >= 1
    # What the checkpoint carries (the driver's lineage.schedule) survives its JSON round trip.
    saved = schedule_from_json(schedule_to_json(loop.database.schedule_now()))
    assert max(mb.minibatch_id for mb in saved) >= len(schedule)  # re-planned minibatches in it
    rest = remaining_schedule(saved, consumed)
    unsent = [mb.prompt_ids for mb in loop.database.unsent_tail()]
    # The resumed run sends the re-planned tail in the re-planned order (after re-issuing what was
    # in flight or queued when the run stopped).
    resumed_order = [mb.prompt_ids for mb in sorted(rest, key=lambda mb: mb.order_index)]
    assert resumed_order[-len(unsent) :] == unsent
    second = OnlineAsp(prior, params, recency_window=16)
    _, _, consumed_after = _run(second, rest)
    everything = consumed + consumed_after
    assert sorted(everything) == sorted(p for mb in schedule for p in mb.prompt_ids)


def test_a_resumed_runs_checkpoint_keeps_the_prompts_consumed_before_it() -> None:
    """A resumed CU holds only the remaining prompts; the carried schedule must still list the
    lineage's consumed ones, or the next resume finds consumed prompts it does not know."""
    schedule = _schedule(32, b=4)
    params = ScheduleParams(b=4, kappa=0, k=2, sa_iterations=2000)
    prior = {p: 10.0 for mb in schedule for p in mb.prompt_ids}
    consumed_before = [f"p{i}" for i in range(6)]  # minibatch 1 is partly consumed
    rest = remaining_schedule(schedule, consumed_before)
    loop, _, consumed_now = _run(OnlineAsp(prior, params, recency_window=8), rest, max_steps=1)
    carried = carry_schedule(schedule, loop.database.schedule_now())
    assert sorted(p for mb in carried for p in mb.prompt_ids) == sorted(prior)
    assert len({mb.minibatch_id for mb in carried}) == len(carried)
    assert len({mb.order_index for mb in carried}) == len(carried)
    again = remaining_schedule(carried, [*consumed_before, *consumed_now])
    assert sorted(p for mb in again for p in mb.prompt_ids) == sorted(
        set(prior) - set(consumed_before) - set(consumed_now)
    )
    assert carry_schedule(schedule, schedule) == tuple(schedule)


def test_a_later_pass_of_a_prompt_is_estimated_from_its_measured_length() -> None:
    """A run over a small dataset draws ``p3`` again as ``p3@1``: online ASP must key both as one
    prompt, or the per-prompt history never applies to a real run's repeated prompts."""
    first = _schedule(8, b=4)
    again = [
        dataclasses.replace(
            mb, minibatch_id=mb.minibatch_id + 2, prompt_ids=tuple(f"{p}@1" for p in mb.prompt_ids)
        )
        for mb in first
    ]
    prior = {p: 10.0 for mb in [*first, *again] for p in mb.prompt_ids}
    hook = OnlineAsp(prior, ScheduleParams(b=4, kappa=0, k=2, sa_iterations=200), recency_window=8)
    for mb in first:
        hook.observe(_completed(mb, attempt=0, version=0, now=0.0))
    tail = tuple(p for mb in again for p in mb.prompt_ids)
    plans = []

    def replan(planner):  # the loop's side: plan the tail, swap nothing
        plans.append(planner(tail))
        return ReplanOutcome(num_prompts=0, minibatches_before=0, minibatches_after=0, wall_seconds=0.0)

    hook.replan_now(replan)
    # No refit yet, so the calibration is the identity: the tail's load is the measured lengths.
    assert sum(plans[0].loads) == pytest.approx(sum(_true_length(p.split("@")[0]) for p in tail))
    assert sum(plans[0].loads) != pytest.approx(10.0 * len(tail))


def test_pass_aliases_round_trip() -> None:
    assert [pass_alias("q17", d) for d in range(3)] == ["q17", "q17@1", "q17@2"]
    assert [prompt_of(pass_alias("a@b", d)) for d in range(3)] == ["a@b"] * 3
    assert prompt_of("user@example") == "user@example"
    assert prompt_of("x@01") == "x@01"  # not an alias the run writes
    with pytest.raises(ValueError, match="draws count from 0"):
        pass_alias("q", -1)
