from __future__ import annotations

import dataclasses
import json

import pytest
from runtime_fakes import complete, make_config, make_schedule

from mindspeed_rl.runtime import (
    Assignment,
    ControlLoop,
    EventLog,
    FakeClock,
    IngestOutcome,
    ProtocolError,
    SnapshotInfo,
    StartRefusal,
)
from mindspeed_rl.runtime.events import BackpressureChanged, MinibatchReceived, MinibatchRequeued


def _loop(num_minibatches: int = 6, **overrides: object) -> tuple[ControlLoop, FakeClock]:
    clock = FakeClock()
    config = make_config(**overrides)
    return ControlLoop(
        config=config, schedule=make_schedule(num_minibatches, group_size=2), clock=clock
    ), clock


def _start(loop: ControlLoop, a: Assignment, actor_id: int, version: int = 0) -> StartRefusal | None:
    decision = loop.request_start(
        a.minibatch.minibatch_id, attempt=a.attempt, gu_id=a.gu_id, actor_id=actor_id, policy_version=version
    )
    return decision.refusal


def _finish(loop: ControlLoop, a: Assignment, actor_id: int, version: int = 0, **kw: object) -> IngestOutcome:
    n = loop.config.num_samples_per_prompt
    return loop.on_minibatch_completed(
        complete(a, actor_id=actor_id, policy_version=version, num_samples_per_prompt=n, **kw)  # type: ignore[arg-type]
    )


def test_a_full_small_run_through_the_facade() -> None:
    loop, clock = _loop(4, num_prompts_per_global_batch=4, max_policy_lag=1)
    work = loop.on_gu_capacity(0, num_actors=2)
    assert [a.minibatch.minibatch_id for a in work] == [0, 1, 2, 3]  # whole groups of 2 up to high=3
    for i, a in enumerate(work):
        actor = i % 2
        assert _start(loop, a, actor) is None
        clock.advance(1.0)
        assert (
            _finish(loop, a, actor, started_at=clock.now() - 1, finished_at=clock.now())
            is IngestOutcome.ACCEPTED
        )
        if i == 1:
            batch = loop.pop_global_batch(0)
            assert batch is not None and batch.num_prompts == 4
            assert all(s.received_at is not None for s in batch.samples)
            clock.advance(2.0)
            loop.on_train_step_done(
                0, SnapshotInfo(version=1, path="/s/1", created_at=clock.now()), save_seconds=0.1
            )
    assert loop.pop_global_batch(1) is not None
    clock.advance(2.0)
    loop.on_train_step_done(1)
    assert loop.is_finished()
    summary = loop.summary()
    data = json.loads(json.dumps(summary.to_dict()))
    for key in (
        "prompts_scheduled",
        "prompts_consumed",
        "duplicate_minibatches_dropped",
        "minibatches_reissued",
        "max_policy_lag_measured",
        "max_queue_depth_samples",
        "queue_limit_samples",
    ):
        assert key in data
    assert (summary.prompts_scheduled, summary.prompts_consumed, summary.train_steps) == (8, 8, 2)
    assert summary.max_policy_lag_measured == 1  # step 1 trained on version-0 samples
    assert summary.mean_policy_lag_eq4_estimate is not None
    assert [a.num_minibatches for a in summary.actors] == [2, 2]
    assert len(loop.events.of_type(MinibatchReceived)) == 4
    lines = [json.dumps(EventLog.to_json_dict(e)) for e in loop.events]
    assert json.loads(lines[0])["event"] == "MinibatchIssued"
    assert len(loop.events.since(len(lines) - 1)) == 1


def test_starts_are_refused_while_paused_and_resume_after_draining() -> None:
    loop, clock = _loop(8, queue_max_samples=8, queue_resume_samples=6, max_policy_lag=None)
    work = loop.on_gu_capacity(0, num_actors=4)
    for actor, a in enumerate(work[:3]):
        assert _start(loop, a, actor) is None
    for actor, a in enumerate(work[:3]):
        _finish(loop, a, actor)  # 3 minibatches x 2 prompts x 2 samples = 12 > 8
    assert loop.pause_signal()
    assert _start(loop, work[3], 3) is StartRefusal.BACKPRESSURE
    assert loop.pop_global_batch(0) is not None  # 12 - 8 = 4 samples <= 6: resume
    assert not loop.pause_signal()
    assert _start(loop, work[3], 3) is None
    flips = [e.paused for e in loop.events.of_type(BackpressureChanged)]
    assert flips == [True, False]
    assert loop.summary().starts_refused == {"backpressure": 1}


def test_lag_bound_refuses_starts_that_could_not_be_consumed_in_time() -> None:
    loop, _ = _loop(8, num_prompts_per_global_batch=2, max_policy_lag=1, gu_queue_high=6)
    work = loop.on_gu_capacity(0, num_actors=8)
    assert _start(loop, work[0], 0) is None  # 2 prompts, deadline step 1 (4 slots)
    assert _start(loop, work[1], 1) is None
    assert _start(loop, work[2], 2) is StartRefusal.POLICY_LAG
    with pytest.raises(ProtocolError, match="newer than the newest published"):
        _start(loop, work[2], 2, version=1)


def test_revoked_work_and_broken_protocol_are_reported() -> None:
    loop, _ = _loop()
    work = loop.on_gu_capacity(0, num_actors=2)
    assert _start(loop, dataclasses.replace(work[0], gu_id=1), 0) is StartRefusal.REVOKED
    assert _start(loop, dataclasses.replace(work[0], attempt=1), 0) is StartRefusal.REVOKED
    with pytest.raises(ProtocolError, match="without a granted start"):
        _finish(loop, work[0], 0)
    assert _start(loop, work[0], 0) is None
    with pytest.raises(ProtocolError, match="one minibatch at a time"):
        _start(loop, work[1], 0)
    short = complete(work[0], actor_id=0, policy_version=0, num_samples_per_prompt=1)
    with pytest.raises(ProtocolError, match="exactly 2 samples"):
        loop.on_minibatch_completed(short)
    with pytest.raises(ProtocolError, match="started on GU 0 actor 0"):
        _finish(loop, work[0], actor_id=1)
    with pytest.raises(ProtocolError, match="in order"):
        loop.pop_global_batch(3)
    with pytest.raises(ProtocolError, match="without a popped global batch"):
        loop.on_train_step_done(0)
    with pytest.raises(ValueError, match="number of finished trainer steps"):
        loop.on_snapshot_published(SnapshotInfo(version=1, path="/s", created_at=0.0))


def test_late_reply_from_a_failed_attempt_on_the_same_actor_is_not_accepted() -> None:
    loop, _ = _loop()
    work = loop.on_gu_capacity(0, num_actors=1)
    assert _start(loop, work[0], 0) is None
    issued = [a.minibatch.minibatch_id for a in work]
    assert loop.on_actor_failed(0, 0) == issued  # its only actor: the whole GU's work
    assert loop.summary().minibatches_reissued == 0  # re-queued, not yet re-issued
    again = loop.on_gu_capacity(0, num_actors=1)  # the GU restarts the actor under the same id
    # Re-issues first, one at a time up to ``high`` (3); the fourth waits, still ahead of new work.
    assert [(a.minibatch.minibatch_id, a.attempt) for a in again] == [(i, 1) for i in issued[:3]]
    assert _start(loop, work[1], 0) is StartRefusal.REVOKED  # stale queue entry from attempt 0
    assert _start(loop, again[0], 0) is None
    assert _finish(loop, work[0], 0) is IngestOutcome.SUPERSEDED  # attempt 0 came back late
    assert _finish(loop, again[0], 0) is IngestOutcome.ACCEPTED
    assert _finish(loop, work[0], 0) is IngestOutcome.DUPLICATE
    summary = loop.summary()
    assert (summary.superseded_completions_dropped, summary.duplicate_minibatches_dropped) == (1, 1)
    assert summary.minibatches_reissued == 3
    reasons = {e.reason for e in loop.events.of_type(MinibatchRequeued)}
    assert reasons == {"actor_failed", "gu_without_actors"}
    assert loop.observe().queue_depth_samples == 2 * loop.config.num_samples_per_prompt  # counted once
    loop.check_invariants()


def test_reloads_are_checked_against_the_newest_snapshot() -> None:
    loop, clock = _loop(6, num_prompts_per_global_batch=2)
    work = loop.on_gu_capacity(0, num_actors=1)
    assert _start(loop, work[0], 0) is None
    _finish(loop, work[0], 0)
    assert loop.pop_global_batch(0) is not None
    clock.advance(1.0)
    loop.on_train_step_done(0, SnapshotInfo(version=1, path="/s/1", created_at=1.0))
    assert loop.latest_snapshot() == SnapshotInfo(version=1, path="/s/1", created_at=1.0)
    loop.on_snapshot_converted(0, 1, 0.5)
    loop.on_weights_loaded(0, 0, 1, 0.25)
    loop.on_weights_loaded(0, 0, 0, 0.25)  # an old snapshot: counted as a violation
    with pytest.raises(ProtocolError, match="only 1 is published"):
        loop.on_weights_loaded(0, 0, 2, 0.25)
    summary = loop.summary()
    assert summary.reloads_not_newest == 1
    assert summary.actors[0].num_reloads == 2
    current = loop.observe().timings
    assert current is not None and (current.t_convert, current.t_load, current.t_train) == (0.5, 0.25, 1.0)


def test_last_global_batch_may_be_short_once_all_work_is_done() -> None:
    loop, _ = _loop(3, num_prompts_per_global_batch=4, max_policy_lag=3)  # 6 prompts
    work = loop.on_gu_capacity(0, num_actors=3)
    for actor, a in enumerate(work):
        assert _start(loop, a, actor) is None
    for actor, a in enumerate(work[:2]):
        _finish(loop, a, actor)
    first = loop.pop_global_batch(0)
    assert first is not None and first.num_prompts == 4
    loop.on_train_step_done(0)
    assert loop.pop_global_batch(1) is None  # 0 queued, one minibatch still running
    _finish(loop, work[2], 2)
    last = loop.pop_global_batch(1)
    assert last is not None and last.num_prompts == 2
    assert loop.is_finished()


def test_schedule_with_unadmittable_minibatches_is_rejected() -> None:
    with pytest.raises(ValueError, match="cannot always be admitted"):
        ControlLoop(
            config=make_config(max_policy_lag=1, num_prompts_per_global_batch=1),
            schedule=make_schedule(2, prompts_per_minibatch=(3, 3)),
            clock=FakeClock(),
        )


def test_has_idle_actor_counts_granted_minibatches_against_live_actors() -> None:
    loop, _ = _loop(6)
    work = loop.on_gu_capacity(0, num_actors=2)
    assert loop.has_idle_actor(0) and not loop.has_idle_actor(7)  # an unknown GU has none
    assert _start(loop, work[0], 0) is None and loop.has_idle_actor(0)
    assert _start(loop, work[1], 1) is None and not loop.has_idle_actor(0)
    _finish(loop, work[0], 0)
    assert loop.has_idle_actor(0)


def test_a_conversion_reported_late_is_logged_at_the_time_it_ended() -> None:
    loop, clock = _loop(2, num_prompts_per_global_batch=2)
    work = loop.on_gu_capacity(0, num_actors=1)
    assert _start(loop, work[0], 0) is None
    _finish(loop, work[0], 0)
    assert loop.pop_global_batch(0) is not None
    loop.on_train_step_done(0, SnapshotInfo(version=1, path="/s/1", created_at=0.0))
    clock.advance(3.0)
    loop.on_snapshot_converted(0, 1, 0.5, at=1.0)
    loop.on_snapshot_converted(0, 1, 0.5)
    times = [e.time for e in loop.events if e.__class__.__name__ == "SnapshotConverted"]
    assert times == [1.0, 3.0]
