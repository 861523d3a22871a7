"""No hangs, bounded memory: failed attempts and poison input, stall diagnosis, the queue bound,
the duty cycle of dropped work, and the event log streamed to disk."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from runtime_fakes import complete, make_config, make_schedule

from mindspeed_rl.runtime import Assignment, ControlLoop, EventLog, FakeClock, IngestOutcome
from mindspeed_rl.runtime.events import ActorFaulted, TrainStepDone
from mindspeed_rl.runtime.faults import (
    FailedAttempt,
    FaultKind,
    FaultLedger,
    PoisonedMinibatch,
    RunningMinibatch,
    StalledPipeline,
    StallView,
    diagnose_stall,
)


def _loop(**overrides: object) -> tuple[ControlLoop, FakeClock]:
    clock = FakeClock()
    loop = ControlLoop(config=make_config(**overrides), schedule=make_schedule(6, group_size=2), clock=clock)
    return loop, clock


def _start(loop: ControlLoop, a: Assignment, actor_id: int) -> None:
    mb = a.minibatch.minibatch_id
    decision = loop.request_start(mb, attempt=a.attempt, gu_id=a.gu_id, actor_id=actor_id, policy_version=0)
    assert decision.granted


def _fail_until_poison(loop: ControlLoop, kind: FaultKind) -> list[int]:
    """Fail whatever actor 0 of GU 0 runs, restarting it, until the loop turns fatal."""
    failed: list[int] = []
    while loop.fatal is None:
        loop.dispatch()
        work = _next_queued(loop)
        _start(loop, work, 0)
        failed.append(work.minibatch.minibatch_id)
        loop.on_actor_fault(0, 0, kind, "boom", retire=False)
    return failed


def _next_queued(loop: ControlLoop) -> Assignment:
    """What a GU's policy starts next: a re-issued minibatch first, else the oldest queued."""
    rec = [(i, r) for i, r in loop.database.in_flight_items() if r.actor_id is None]
    i, r = min(rec, key=lambda x: (-x[1].attempt, x[0]))
    return Assignment(minibatch=loop.database.minibatch(i), gu_id=r.gu_id, attempt=r.attempt, issued_at=0.0)


def test_a_minibatch_failing_every_attempt_is_named_as_poison() -> None:
    loop, _ = _loop(minibatch_max_attempts=3)
    loop.register_gu(0, num_actors=1)
    failed = _fail_until_poison(loop, FaultKind.ERROR)
    assert failed == [0, 0, 0]  # the re-issue is sent (and started) before new work
    assert isinstance(loop.fatal, PoisonedMinibatch) and loop.failure() is loop.fatal
    message = str(loop.fatal)
    assert "minibatch 0 failed all 3 attempts" in message
    assert str(list(loop.database.minibatch(0).prompt_ids)) in message and "boom" in message
    assert loop.dispatch() == []  # nothing more is sent once the run is failing
    seen = loop.observe()
    assert seen.minibatch_errors == 3 and seen.actor_restarts == 3 and seen.minibatches_timed_out == 0
    assert [e.replaced for e in loop.events.of_type(ActorFaulted)] == [True, True, True]


def test_a_failed_attempt_is_reissued_and_forgotten_once_completed() -> None:
    loop, _ = _loop(minibatch_max_attempts=2)
    loop.register_gu(0, num_actors=1)
    first = loop.dispatch()[0]
    _start(loop, first, 0)
    assert loop.on_actor_fault(0, 0, FaultKind.TIMEOUT, "hung", retire=False) == [0]
    loop.dispatch()
    retry = _next_queued(loop)
    assert retry.attempt == 1 and loop.faults.num_failed(0) == 1
    _start(loop, retry, 0)
    n = loop.config.num_samples_per_prompt
    assert loop.on_minibatch_completed(
        complete(retry, actor_id=0, policy_version=0, num_samples_per_prompt=n)
    ) is (IngestOutcome.ACCEPTED)
    assert loop.faults.num_failed(0) == 0 and loop.observe().minibatches_timed_out == 1
    assert loop.fatal is None


def test_a_retired_actor_reduces_capacity_and_the_last_one_fails_its_gu() -> None:
    loop, _ = _loop()
    loop.register_gu(0, num_actors=1)
    work = loop.dispatch()
    _start(loop, work[0], 0)
    loop.on_actor_fault(0, 0, FaultKind.DIED, "exit", retire=True)
    assert not loop.has_gu(0) and loop.observe().actor_deaths == 1
    failure = loop.failure()
    assert isinstance(failure, StalledPipeline) and "no Generation Unit is left" in str(failure)


def test_no_progress_past_the_stall_timeout_is_diagnosed() -> None:
    loop, clock = _loop(stall_timeout_s=60.0)
    loop.register_gu(0, num_actors=1)
    _start(loop, loop.dispatch()[0], 0)
    clock.advance(59.0)
    assert loop.failure() is None
    clock.advance(2.0)
    failure = loop.failure()
    assert isinstance(failure, StalledPipeline)
    assert "GU 0 actor 0 on minibatch 0" in str(failure) and "minibatch_timeout_s" in str(failure)


def _view(**overrides: object) -> StallView:
    base: dict[str, object] = dict(
        idle_seconds=100.0, live_gus=[0, 1], running=[], num_issued_not_started=0, num_unsent=0,
        paused=False, queue_depth_samples=0, latest_version=3, next_step=7, last_refusal={}, now=1000.0,
    )  # fmt: skip
    base.update(overrides)
    return StallView(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"live_gus": []}, "no Generation Unit is left"),
        (
            {"running": [RunningMinibatch(minibatch_id=4, gu_id=1, actor_id=2, started_at=800.0)]},
            "GU 1 actor 2 on minibatch 4 for 200 s",
        ),
        ({"num_issued_not_started": 2, "last_refusal": {1: "stale_weights"}}, "GU(s) [1] refused for stale"),
        ({"paused": True, "queue_depth_samples": 40}, "paused by backpressure (queue 40 samples)"),
        ({"num_unsent": 3}, "3 minibatch(es) are not sent"),
        (
            {"running": [RunningMinibatch(minibatch_id=4, gu_id=1, actor_id=2, started_at=990.0)]},
            "1 minibatch(es) running",
        ),
    ],
)
def test_stall_reasons_name_the_unit(overrides: dict[str, object], expected: str) -> None:
    message = str(diagnose_stall(_view(**overrides), stall_timeout_s=60.0))
    assert expected in message and "stall_timeout_s=60" in message


def test_the_ledger_refuses_a_zero_budget() -> None:
    with pytest.raises(ValueError, match="minibatch_max_attempts"):
        FaultLedger(max_attempts=0)
    ledger = FaultLedger(max_attempts=1)
    attempt = FailedAttempt(minibatch_id=5, gu_id=0, actor_id=0, kind=FaultKind.ERROR, detail="x")
    assert isinstance(ledger.record(attempt, ["p1"]), PoisonedMinibatch)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"minibatch_timeout_s": 0.0}, "minibatch_timeout_s must be > 0"),
        ({"minibatch_timeout_s": 30.0, "stall_timeout_s": 30.0}, "must exceed minibatch_timeout_s"),
        ({"actor_max_restarts": -1}, "actor_max_restarts >= 0"),
    ],
)
def test_fault_settings_are_checked(settings: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_config(**settings)


def test_queue_bound_is_q_max_plus_one_largest_minibatch_per_actor() -> None:
    loop, _ = _loop(queue_max_samples=16)
    loop.register_gu(0, num_actors=2)
    loop.register_gu(1, num_actors=3)
    largest = loop.database.max_minibatch_prompts
    assert loop.observe().queue_bound_samples == 16 + 5 * largest * loop.config.num_samples_per_prompt


def test_a_dropped_completion_is_not_counted_as_generation() -> None:
    loop, clock = _loop()
    loop.register_gu(0, num_actors=2)
    first = loop.dispatch()[0]
    _start(loop, first, 0)
    loop.on_actor_fault(0, 0, FaultKind.TIMEOUT, "hung", retire=False)
    clock.advance(5.0)
    n = loop.config.num_samples_per_prompt
    late = complete(
        first, actor_id=0, policy_version=0, num_samples_per_prompt=n, started_at=0.0, finished_at=5.0
    )
    assert loop.on_minibatch_completed(late) is IngestOutcome.SUPERSEDED
    assert (0, 0) not in loop.activity.actors  # the superseded reply credited no generation time


def test_the_event_log_streams_to_a_file_and_keeps_only_unread_events() -> None:
    log, sink = EventLog(), io.StringIO()
    for step in range(5):
        log.append(TrainStepDone(time=float(step), step=step, train_seconds=1.0))
    assert log.write_new(sink) == 5
    log.trim(3)
    assert len(log) == 5 and [e.step for e in log] == [3, 4]
    assert [e.step for e in log.since(4)] == [4]  # type: ignore[union-attr]
    log.append(TrainStepDone(time=5.0, step=5, train_seconds=1.0))
    log.trim(6)  # only what is written may go
    assert [e.step for e in log] == [5]  # type: ignore[union-attr]
    assert log.write_new(sink) == 1
    assert [json.loads(line)["step"] for line in sink.getvalue().splitlines()] == list(range(6))
    with pytest.raises(ValueError, match="trimmed"):
        log.since(0)


def _deadlines(**overrides: Any) -> Any:
    from mindspeed_rl.runtime.minibatch_deadline import DeadlineSettings, MinibatchDeadlines

    values: dict[str, Any] = {
        "fixed_s": None,
        "factor": 8.0,
        "floor_s": 10.0,
        "warmup_s": 300.0,
        "stall_s": 900.0,
    }
    values.update(overrides)
    return MinibatchDeadlines(DeadlineSettings(**values))


def test_derived_timeout_warms_up_then_scales_with_predicted_load() -> None:
    d = _deadlines()
    assert d.timeout_for(1000) == 300.0  # nothing measured yet: the warm-up bound
    for seconds, load in ((2.0, 100), (3.0, 100), (1.0, 200)):  # slowest: 0.03 s per predicted token
        d.observe(seconds, load)
    assert d.timeout_for(1000) == pytest.approx(8 * 0.03 * 1000)
    assert d.timeout_for(1000, warm_engine=False) == 300.0  # a fresh engine's first minibatch
    assert d.timeout_for(10) == 10.0  # the floor
    assert d.timeout_for(10_000_000) == pytest.approx(0.8 * 900)  # stays below the stall detector


def test_tool_waits_do_not_read_as_slow_decoding_and_are_allowed_for() -> None:
    d = _deadlines()
    # 10 s of which the slowest trajectory waited 6 s on tools: 4 s decoded 100 predicted tokens.
    d.observe(10.0, 100, tool_seconds=6.0)
    assert d.timeout_for(1000) == pytest.approx(8 * (0.04 * 1000 + 6.0))
    single = _deadlines()
    single.observe(10.0, 100)  # the same duration without tools is all decoding
    assert single.timeout_for(500) == pytest.approx(8 * 0.1 * 500)
    clipped = _deadlines()
    clipped.observe(2.0, 100, tool_seconds=5.0)  # a report past the duration counts as the duration
    assert clipped.timeout_for(1000) == pytest.approx(8 * 2.0)


def test_an_explicit_timeout_wins_and_no_factor_means_no_bound() -> None:
    assert _deadlines(fixed_s=42.0).timeout_for(5) == 42.0
    assert _deadlines(factor=None).timeout_for(5) is None
    with pytest.raises(ValueError, match="minibatch_timeout_factor=1"):
        _deadlines(factor=1.0)


def test_running_minibatches_expire_and_skip_warm_up_runs() -> None:
    from mindspeed_rl.runtime.minibatch_deadline import DeadlineSettings, RunningMinibatches

    running = RunningMinibatches(
        DeadlineSettings(fixed_s=None, factor=4.0, floor_s=1.0, warmup_s=50.0, stall_s=None)
    )
    running.start("a", actor_id=0, predicted_load=10, now=0.0)  # a cold engine: the warm-up bound
    assert running.deadlines() == [50.0]
    first = running.pop("a")
    assert first is not None
    running.succeeded(first, now=30.0)  # warm-up inside: not measured
    running.start("b", actor_id=0, predicted_load=10, now=30.0)
    assert running.deadlines() == [80.0]  # still nothing measured on this GU
    second = running.pop("b")
    assert second is not None
    running.succeeded(second, now=32.0)  # 0.2 s per predicted token
    running.start("c", actor_id=0, predicted_load=10, now=32.0)
    assert running.deadlines() == [pytest.approx(32.0 + 4 * 0.2 * 10)]
    assert running.expired(now=39.0) == [] and [k for k, _, _ in running.expired(now=40.1)] == ["c"]
    running.engine_replaced(0)
    running.start("d", actor_id=0, predicted_load=10, now=41.0)
    assert max(running.deadlines()) == 91.0  # the replacement warms up again
