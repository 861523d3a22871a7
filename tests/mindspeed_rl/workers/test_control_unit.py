"""The ControlUnit adapter without Ray: outbox delivery, GU failure, snapshot announcements, metrics."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from mindspeed_rl.models.rollout.base import SamplingConfig
from mindspeed_rl.runtime.config import RuntimeConfig
from mindspeed_rl.runtime.records import (
    Assignment,
    CompletedMinibatch,
    GlobalBatch,
    Sample,
    ScheduledMinibatch,
    SnapshotInfo,
    StartDecision,
    StartRefusal,
)
from mindspeed_rl.workers.control_unit import ControlUnit
from mindspeed_rl.workers.evaluator import EvalJob, EvalSettings, HeldOutDecode
from mindspeed_rl.workers.gu_messages import ConversionReport, GuPoll, GuReport, ReloadReport, StartRequest

N = 2  # samples per prompt
# The waits a test expects to be woken from: longer than the suite's per-test timeout, so only the
# wake-up ends them (a missed one fails by that timeout), never a race against a wall-clock bound.
WAKE_ONLY_S = 3600.0


def schedule(num_minibatches: int, prompts_each: int = 2, group_size: int = 2) -> list[ScheduledMinibatch]:
    return [
        ScheduledMinibatch(
            minibatch_id=i,
            prompt_ids=tuple(f"p{i}_{j}" for j in range(prompts_each)),
            batch_group_id=i // group_size,
            predicted_load=10.0 + i,
            order_index=i,
        )
        for i in range(num_minibatches)
    ]


def make_cu(num_minibatches: int = 8, **overrides: int) -> ControlUnit:
    config = RuntimeConfig(
        num_prompts_per_global_batch=4,
        num_samples_per_prompt=N,
        queue_max_samples=overrides.get("queue_max_samples", 16),
        queue_resume_samples=overrides.get("queue_resume_samples", 8),
        gu_queue_low=1,
        gu_queue_high=2,
        max_policy_lag=2,
    )
    return ControlUnit(config, schedule(num_minibatches))


def completed(
    mb: ScheduledMinibatch, *, gu: int, actor: int, attempt: int = 0, version: int = 0
) -> CompletedMinibatch:
    now = time.time()
    samples = tuple(
        Sample(
            prompt_id=pid,
            sample_index=j,
            minibatch_id=mb.minibatch_id,
            response_token_ids=(1, 2, 3),
            rollout_log_probs=(-0.1, -0.2, -0.3),
            reward=None,
            policy_version=version,
            gu_id=gu,
            actor_id=actor,
            sent_at=now,
        )
        for pid in mb.prompt_ids
        for j in range(N)
    )
    return CompletedMinibatch(
        minibatch_id=mb.minibatch_id,
        attempt=attempt,
        samples=samples,
        gu_id=gu,
        actor_id=actor,
        policy_version=version,
        started_at=now - 0.5,
        finished_at=now,
    )


def test_poll_delivers_each_assignment_once_and_spreads_over_gus() -> None:
    cu = make_cu()
    cu.register_gu(0, 1)
    cu.register_gu(1, 1)
    assert cu.start() > 0
    first = {g: cu.poll(g) for g in (0, 1)}
    assert all(p.assignments and p.gu_known and not p.finished for p in first.values())
    delivered = [a.minibatch.minibatch_id for p in first.values() for a in p.assignments]
    assert len(delivered) == len(set(delivered))
    again = [a.minibatch.minibatch_id for g in (0, 1) for a in cu.poll(g).assignments]
    assert not set(again) & set(delivered)  # nothing is delivered twice
    assert all(a.gu_id == g for g, p in first.items() for a in p.assignments)


def test_failed_gu_is_told_to_stop_and_its_work_goes_to_the_other_gu() -> None:
    cu = make_cu()
    cu.register_gu(0, 1)
    cu.register_gu(1, 1)
    cu.start()
    held = [a.minibatch.minibatch_id for a in cu.poll(0).assignments]
    queue_1 = list(cu.poll(1).assignments)
    requeued = cu.on_gu_failed(0)
    assert sorted(requeued) == sorted(held)
    assert cu.on_gu_failed(0) == []  # reported twice (driver and GU): counted once
    assert not cu.poll(0).gu_known
    # GU 1 works through its queue; once it drains to the low mark the re-issues arrive first.
    reissued: dict[int, int] = {}
    while queue_1:
        a = queue_1.pop(0)
        assert cu.request_start(
            a.minibatch.minibatch_id, attempt=a.attempt, gu_id=1, actor_id=0, policy_version=0
        ).granted
        cu.on_minibatch_completed(completed(a.minibatch, gu=1, actor=0, attempt=a.attempt))
        new = cu.poll(1).assignments
        reissued.update({b.minibatch.minibatch_id: b.attempt for b in new if b.attempt > 0})
        queue_1 += new
        if set(held) <= set(reissued):
            break
    assert set(held) <= set(reissued) and all(reissued[i] == 1 for i in held)
    assert cu.summary()["minibatches_reissued"] == len(held)


def test_completion_flows_to_a_global_batch_with_metrics_and_summary() -> None:
    cu = make_cu(num_minibatches=2)
    cu.register_gu(0, 2)
    cu.start()
    work = cu.poll(0).assignments
    for actor, a in enumerate(work):
        decision = cu.request_start(
            a.minibatch.minibatch_id, attempt=a.attempt, gu_id=0, actor_id=actor, policy_version=0
        )
        assert decision.granted
        assert cu.on_minibatch_completed(completed(a.minibatch, gu=0, actor=actor)) == "accepted"
    # A late duplicate of a completed minibatch is dropped, not queued twice.
    assert cu.on_minibatch_completed(completed(work[0].minibatch, gu=0, actor=0)) == "duplicate"
    batch = cu.pop_global_batch(0)
    assert batch is not None and batch.num_prompts == 4
    metrics = cu.on_train_step_done(0)
    for key in (
        "queue/depth_samples_max",
        "lag/d_off_mean",
        "lag/d_off_max",
        "duty_cycle_mean",
        "gen/gu0/minibatches",
    ):
        assert key in metrics, key
    assert metrics["queue/depth_samples_max"] == 8 and metrics["gen/gu0/minibatches"] == 2
    assert cu.step_metrics()["gen/minibatches"] == 0  # the next digest only covers what is new
    summary = cu.summary()
    assert summary["prompts_consumed"] == summary["prompts_scheduled"] == 4
    assert summary["duplicate_minibatches_dropped"] == 1
    assert cu.is_finished() and cu.poll(0).finished
    cu.check_invariants()


def test_a_step_served_from_earlier_samples_reports_its_starting_queue_depth() -> None:
    cu = make_cu(num_minibatches=4)
    cu.register_gu(0, 4)
    cu.start()
    _complete_on_actors(cu, 4)
    assert cu.pop_global_batch(0) is not None
    first = cu.on_train_step_done(0)
    assert first["queue/depth_samples_max"] == 16 and first["queue/depth_samples_now"] == 8
    # Step 1 trains on the 8 samples left over: no arrivals, but the queue held 8 at its start.
    assert cu.pop_global_batch(1) is not None
    second = cu.on_train_step_done(1)
    assert second["queue/arrivals"] == 0
    assert second["queue/depth_samples_max"] == 8 and second["queue/depth_samples_now"] == 0
    assert "queue/depth_samples_mean" not in second  # a mean over no arrivals is not reported


def test_wait_global_batch_wakes_on_the_completion_that_makes_the_batch() -> None:
    cu = make_cu(num_minibatches=2)
    cu.register_gu(0, 2)
    cu.start()
    assert cu.wait_global_batch(0, timeout_s=0.01) is None  # nothing generated yet: times out
    got: list[GlobalBatch | None] = []
    waiter = threading.Thread(
        target=lambda: got.append(cu.wait_global_batch(0, timeout_s=WAKE_ONLY_S)), daemon=True
    )
    waiter.start()
    pending = _complete_on_actors(cu, 1)  # half a global batch: the waiter must keep waiting
    waiter.join(timeout=0.2)
    assert waiter.is_alive() and not got
    _complete_on_actors(cu, 1, pending)
    waiter.join()  # only the completion can end this wait (WAKE_ONLY_S)
    assert got[0] is not None and got[0].step == 0 and got[0].num_prompts == 4
    with pytest.raises(ValueError, match="timeout_s"):
        cu.wait_global_batch(1, timeout_s=-1.0)


def test_backpressure_refuses_starts_and_shows_in_poll() -> None:
    cu = make_cu(num_minibatches=8, queue_max_samples=8, queue_resume_samples=6)
    cu.register_gu(0, 4)
    cu.start()
    pending = _complete_on_actors(cu, 3)
    poll = cu.poll(0)
    assert poll.paused  # 12 samples queued > Q_max = 8
    head = pending[0]
    decision = cu.request_start(head.minibatch.minibatch_id, attempt=0, gu_id=0, actor_id=3, policy_version=0)
    assert not decision.granted and decision.refusal is StartRefusal.BACKPRESSURE
    assert cu.pop_global_batch(0) is not None
    assert not cu.poll(0).paused  # drained to 4 samples <= resume level 6


def test_out_of_order_snapshot_announcement_is_counted_not_fatal() -> None:
    cu = make_cu()
    cu.register_gu(0, 1)
    cu.start()
    _consume_steps(cu, 2)
    assert cu.on_snapshot_published(SnapshotInfo(version=2, path="/s/v2", created_at=0.0), 0.1)
    assert not cu.on_snapshot_published(SnapshotInfo(version=1, path="/s/v1", created_at=0.0), 0.1)
    poll = cu.poll(0)
    assert poll.latest_snapshot is not None and poll.latest_snapshot.version == 2
    assert cu.summary()["snapshots_superseded"] == 1


def test_reload_is_judged_against_the_newest_snapshot_when_it_was_chosen() -> None:
    cu = make_cu()
    cu.register_gu(0, 1)
    cu.start()
    _consume_steps(cu, 2)
    cu.on_snapshot_published(SnapshotInfo(version=1, path="/s/v1", created_at=0.0), 0.1)
    chosen_at = time.time()
    time.sleep(0.01)
    cu.on_snapshot_published(SnapshotInfo(version=2, path="/s/v2", created_at=0.0), 0.1)
    cu.on_weights_loaded(0, 0, 1, 0.05, chosen_at)  # v2 appeared while loading v1: fine
    assert cu.summary()["reloads_not_newest"] == 0
    cu.on_weights_loaded(0, 0, 1, 0.05, time.time())  # v2 was known: a violation
    assert cu.summary()["reloads_not_newest"] == 1
    loads = [e for e in cu.event_records() if e["event"] == "WeightsLoaded"]
    assert [e["newest_at_start"] for e in loads] == [1, 2]


def _complete_on_actors(
    cu: ControlUnit, num_actors: int, pending: list[Assignment] | None = None
) -> list[Assignment]:
    """Start and complete one minibatch on each of GU 0's first actors, taking work from ``pending``
    (what an earlier call returned) and then the GU's outbox; returns what is still pending."""
    pending = list(cu.poll(0).assignments) if pending is None else pending + list(cu.poll(0).assignments)
    for actor in range(num_actors):
        a = pending.pop(0)
        assert cu.request_start(
            a.minibatch.minibatch_id, attempt=0, gu_id=0, actor_id=actor, policy_version=0
        ).granted
        cu.on_minibatch_completed(completed(a.minibatch, gu=0, actor=actor))
        pending += cu.poll(0).assignments
    return pending


def _consume_steps(cu: ControlUnit, steps: int) -> None:
    """Run ``steps`` trainer steps on actor 0 of GU 0 with initial weights."""
    for step in range(steps):
        while (batch := cu.pop_global_batch(step)) is None:
            work = cu.poll(0).assignments
            for a in work:
                grant = cu.request_start(
                    a.minibatch.minibatch_id, attempt=a.attempt, gu_id=0, actor_id=0, policy_version=0
                )
                assert grant.granted, grant.refusal
                cu.on_minibatch_completed(completed(a.minibatch, gu=0, actor=0))
        assert batch.step == step
        cu.on_train_step_done(step)


def test_unknown_gu_assignment_is_an_internal_error() -> None:
    cu = make_cu()
    with pytest.raises(ValueError, match="at least one actor"):
        cu.register_gu(0, 0)


def _poll_in_thread(cu: ControlUnit, gu_id: int) -> tuple[threading.Thread, list[object]]:
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(cu.poll(gu_id, wait_s=WAKE_ONLY_S)), daemon=True)
    waiter.start()
    return waiter, got


def test_long_poll_waits_for_news_and_returns_when_the_pause_flips() -> None:
    cu = make_cu(num_minibatches=8, queue_max_samples=8, queue_resume_samples=6)
    cu.register_gu(0, 4)
    cu.register_gu(1, 1)
    cu.start()
    first = cu.poll(1)
    started = time.monotonic()
    quiet = cu.poll(1, wait_s=0.05)  # nothing changed: returns at the timeout
    assert time.monotonic() - started >= 0.05 and quiet.seq == first.seq + 1 and not quiet.assignments
    waiter, got = _poll_in_thread(cu, 1)
    waiter.join(timeout=0.2)
    assert waiter.is_alive()  # no news yet: still waiting, and not holding the lock:
    _complete_on_actors(cu, 3)  # GU 0's completions go through and pause the pipeline
    waiter.join()  # only news ends this wait (WAKE_ONLY_S)
    answer = got[0]
    assert isinstance(answer, GuPoll) and answer.paused and answer.seq > first.seq


def test_news_for_one_gu_does_not_wake_the_other() -> None:
    cu = make_cu(num_minibatches=8)
    cu.register_gu(0, 1)
    cu.register_gu(1, 1)
    cu.start()
    polls = {g: cu.poll(g) for g in (0, 1)}
    waiter, got = _poll_in_thread(cu, 1)
    head = polls[0].assignments[0]
    assert cu.request_start(
        head.minibatch.minibatch_id, attempt=0, gu_id=0, actor_id=0, policy_version=0
    ).granted
    cu.on_minibatch_completed(completed(head.minibatch, gu=0, actor=0))
    refill = cu.poll(0, wait_s=0.0)
    assert refill.assignments  # GU 0's queue was refilled
    waiter.join(timeout=0.3)
    assert waiter.is_alive() and not got  # GU 1's view did not change: it keeps waiting
    # Only news for GU 1 ends its wait (WAKE_ONLY_S: no timeout to race on a loaded host).
    cu.on_actor_failed(1, 0)
    waiter.join()
    assert isinstance(got[0], GuPoll) and got[0].seq > polls[1].seq


def _report(gu: int, a: Assignment | None = None, *, actor: int = 0, **fields: Any) -> GuReport:
    start = None
    if a is not None:
        mb_id = a.minibatch.minibatch_id
        start = StartRequest(minibatch_id=mb_id, attempt=a.attempt, actor_id=actor, policy_version=0)
    return GuReport(gu_id=gu, start=start, **fields)


def test_exchange_ingests_the_completion_then_starts_the_freed_actor_and_refills_in_one_call() -> None:
    cu = make_cu(num_minibatches=8)
    cu.register_gu(0, 1)
    cu.start()
    queue = list(cu.poll(0).assignments)
    running = queue.pop(0)
    first = cu.exchange(_report(0, running))
    assert first.decision is not None and first.decision.granted
    assert first.assignments  # the start shrank the GU's queue to its low mark: refilled in the answer
    queue += first.assignments
    nxt = queue.pop(0)
    answer = cu.exchange(_report(0, nxt), completed(running.minibatch, gu=0, actor=0))
    assert answer.decision is not None and answer.decision.granted, answer.decision
    assert answer.seq == first.seq + 1
    assert cu.summary()["cu_calls"] == {"exchange": 2, "poll": 1}  # the breakdown summary.json gets
    log = [(e["event"], e["minibatch_id"]) for e in cu.event_records() if e["event"] != "MinibatchIssued"]
    # The completion is in the log before the start of the actor it freed.
    assert log[-2:] == [
        ("MinibatchReceived", running.minibatch.minibatch_id),
        ("MinibatchStarted", nxt.minibatch.minibatch_id),
    ]
    cu.check_invariants()


def test_exchange_reports_reloads_and_conversions_at_the_time_they_ended() -> None:
    cu = make_cu()
    cu.register_gu(0, 1)
    cu.start()
    _consume_steps(cu, 1)
    cu.on_snapshot_published(SnapshotInfo(version=1, path="/s/v1", created_at=0.0), 0.1)
    ended = time.time() - 5.0  # converted a while ago, reported with the GU's next call
    reports = {
        "conversions": (ConversionReport(version=1, seconds=0.3, finished_at=ended),),
        "reloads": (ReloadReport(actor_id=0, version=1, seconds=0.2, chosen_at=time.time()),),
    }
    answer = cu.exchange(_report(0, **reports))
    assert answer.decision is None  # nothing was asked
    events = {e["event"]: e for e in cu.event_records()}
    assert events["SnapshotConverted"]["time"] == ended and events["SnapshotConverted"]["seconds"] == 0.3
    assert events["WeightsLoaded"]["version"] == 1 and events["WeightsLoaded"]["newest_at_start"] == 1
    assert cu.summary()["reloads_not_newest"] == 0


def test_a_busy_gu_is_woken_only_by_a_snapshot_and_an_idle_one_by_any_news() -> None:
    cu = make_cu(num_minibatches=8, queue_max_samples=8, queue_resume_samples=6)
    cu.register_gu(0, 3)
    cu.register_gu(1, 1)
    cu.start()
    head = cu.poll(1).assignments[0]
    assert cu.exchange(_report(1, head)).decision == StartDecision(granted=True)  # GU 1's actor runs
    busy, got_busy = _poll_in_thread(cu, 1)
    _complete_on_actors(cu, 3)  # on GU 0: 12 samples queued, over Q_max = 8
    assert cu.poll(0).paused
    assert cu.pop_global_batch(0) is not None  # drained to 4: resumed
    cu.on_train_step_done(0)
    busy.join(timeout=0.3)
    # Its only actor is busy: pause flips and trainer steps wait for its next exchange.
    assert busy.is_alive() and not got_busy
    cu.on_snapshot_published(SnapshotInfo(version=1, path="/s/v1", created_at=0.0))
    busy.join()  # a snapshot wakes it: it converts while its actor generates
    assert isinstance(got_busy[0], GuPoll) and got_busy[0].latest_snapshot is not None
    cu.poll(0)  # GU 0 catches up; its actors are idle, so ordinary news now wakes it
    idle, got_idle = _poll_in_thread(cu, 0)
    idle.join(timeout=0.2)
    assert idle.is_alive()
    cu.exchange(_report(1), completed(head.minibatch, gu=1, actor=0))
    assert cu.pop_global_batch(1) is not None  # a trainer step: ordinary news
    idle.join()
    assert isinstance(got_idle[0], GuPoll) and got_idle[0].latest_snapshot == got_busy[0].latest_snapshot


def test_news_an_exchange_answer_delivered_does_not_wake_the_outstanding_poll() -> None:
    cu = make_cu(num_minibatches=8)
    cu.register_gu(0, 2)
    cu.start()
    queue = list(cu.poll(0).assignments)
    waiter, got = _poll_in_thread(cu, 0)  # an actor is idle: any news would wake it
    waiter.join(timeout=0.1)
    answer = cu.exchange(_report(0, queue[0]))  # the start shrinks the queue: the refill is in the answer
    assert answer.assignments
    waiter.join(timeout=0.3)
    assert waiter.is_alive() and not got  # it was told already: the poll keeps waiting
    cu.on_actor_failed(0, 1)  # real news
    waiter.join()
    assert isinstance(got[0], GuPoll) and got[0].seq == answer.seq + 1


def test_a_paused_gu_is_woken_by_the_resume_not_by_trainer_steps_before_it() -> None:
    cu = make_cu(num_minibatches=8, queue_max_samples=8, queue_resume_samples=6)
    cu.register_gu(0, 4)
    cu.register_gu(1, 1)
    cu.start()
    head = cu.poll(1).assignments[0]
    assert cu.exchange(_report(1, head)).decision == StartDecision(granted=True)
    _complete_on_actors(cu, 3)  # 12 samples on GU 0: paused
    told = cu.exchange(_report(1), completed(head.minibatch, gu=1, actor=0))  # 16 samples
    assert told.paused
    waiter, got = _poll_in_thread(cu, 1)  # its actor is idle, and it knows the pipeline is paused
    assert cu.pop_global_batch(0) is not None  # a trainer step, but 8 samples > resume level 6
    waiter.join(timeout=0.3)
    assert waiter.is_alive() and not got
    cu.on_train_step_done(0)
    assert cu.pop_global_batch(1) is not None  # drained: resumed
    waiter.join()
    assert isinstance(got[0], GuPoll) and not got[0].paused


@dataclass(frozen=True)
class Rec:
    """A streaming window's prompt record, as far as the CU reads it."""

    prompt_id: str
    token_ids: tuple[int, ...] = (1,)


def test_a_streaming_cu_carries_each_prompts_record_until_it_is_consumed() -> None:
    """asp_config.window: the CU holds the records of the window's prompts, attaches them to every
    assignment (a re-issue too) and to the trainer's batch, then forgets them; the GUs are not
    told to finish while the schedule is open, though everything scheduled so far was consumed."""
    config = RuntimeConfig(num_prompts_per_global_batch=4, num_samples_per_prompt=N, queue_max_samples=16,
                           queue_resume_samples=8, gu_queue_low=1, gu_queue_high=2, max_policy_lag=2)  # fmt: skip
    cu = ControlUnit(config, (), streaming=True)
    chunk = schedule(2)
    with pytest.raises(ValueError, match="without their records"):
        cu.extend_schedule(chunk, [Rec("p0_0")], False)
    cu.extend_schedule(chunk, [Rec(p) for mb in chunk for p in mb.prompt_ids], False)
    cu.register_gu(0, 1)
    cu.register_gu(1, 1)
    cu.start()
    first = [a for g in (0, 1) for a in cu.poll(g).assignments]
    assert first and all([r.prompt_id for r in a.records] == list(a.minibatch.prompt_ids) for a in first)
    cu.on_gu_failed(0)  # its minibatches are re-issued to GU 1, records attached again
    for a in first:
        if a.gu_id == 1:
            cu.request_start(
                a.minibatch.minibatch_id, attempt=a.attempt, gu_id=1, actor_id=0, policy_version=0
            )
            cu.on_minibatch_completed(completed(a.minibatch, gu=1, actor=0, attempt=a.attempt))
    reissued = list(cu.poll(1).assignments)
    assert reissued and all(a.records and a.attempt == 1 for a in reissued)
    for a in reissued:
        cu.request_start(a.minibatch.minibatch_id, attempt=a.attempt, gu_id=1, actor_id=0, policy_version=0)
        cu.on_minibatch_completed(completed(a.minibatch, gu=1, actor=0, attempt=a.attempt))
    batch = cu.pop_global_batch(0)
    assert batch is not None and [r.prompt_id for r in batch.records] == list(batch.prompt_ids)
    assert len(cu._book) == 0  # type: ignore[arg-type]  # consumed: forgotten
    cu.on_train_step_done(0)
    assert not cu.poll(1).finished and not cu.is_finished()  # open: more chunks come
    more = ScheduledMinibatch(minibatch_id=10, prompt_ids=("x0", "x1", "x2", "x3"), batch_group_id=10,
                              predicted_load=1.0, order_index=10)  # fmt: skip
    cu.extend_schedule([more], [Rec(p) for p in more.prompt_ids], True)
    with pytest.raises(ValueError, match="already drawn into the window"):
        cu.extend_schedule([], [Rec("x0")], True)
    (a,) = cu.poll(1).assignments
    assert [r.prompt_id for r in a.records] == ["x0", "x1", "x2", "x3"]
    assert a.minibatch.minibatch_id == len(chunk)  # renumbered after the schedule, not its own 10
    cu.request_start(a.minibatch.minibatch_id, attempt=0, gu_id=1, actor_id=0, policy_version=0)
    cu.on_minibatch_completed(completed(a.minibatch, gu=1, actor=0))
    assert cu.pop_global_batch(1) is not None
    cu.on_train_step_done(1)
    assert cu.is_finished() and cu.poll(1).finished  # closed and drained


def test_an_online_streaming_cu_replans_each_chunk_before_a_gu_can_take_it() -> None:
    """asp_config.window with online: a chunk arriving after start is re-planned from the online
    estimates at once (the GUs would take a small window's work before the next after_step), and
    every one of its prompts is still dispatched exactly once."""
    from asp_scheduler.params import ScheduleParams
    from mindspeed_rl.trainer.online_asp import OnlineAsp

    config = RuntimeConfig(num_prompts_per_global_batch=4, num_samples_per_prompt=N, queue_max_samples=64,
                           queue_resume_samples=32, gu_queue_low=1, gu_queue_high=2, max_policy_lag=4)  # fmt: skip
    first = schedule(2)
    prior = {p: 10.0 for mb in first for p in mb.prompt_ids}
    hook = OnlineAsp(prior, ScheduleParams(b=2, kappa=0, k=2, sa_iterations=200), recency_window=16)
    cu = ControlUnit(config, (), online=hook, streaming=True)
    cu.extend_schedule(first, [Rec(p) for mb in first for p in mb.prompt_ids], False)
    cu.register_gu(0, 1)
    cu.start()
    assert hook.summary()["schedule_replans"] == 0  # the first chunk keeps its offline plan
    chunk = [ScheduledMinibatch(minibatch_id=10 + i, prompt_ids=(f"x{2 * i}", f"x{2 * i + 1}"), batch_group_id=10,
                                predicted_load=float(10 + 100 * i), order_index=10 + i) for i in range(2)]  # fmt: skip
    cu.extend_schedule(chunk, [Rec(p) for mb in chunk for p in mb.prompt_ids], True)
    assert hook.summary()["schedule_replans"] == 1
    sent: list[str] = []
    for _ in range(8):
        for a in cu.poll(0).assignments:
            sent.extend(a.minibatch.prompt_ids)
            assert [r.prompt_id for r in a.records] == list(a.minibatch.prompt_ids)
            cu.request_start(
                a.minibatch.minibatch_id, attempt=a.attempt, gu_id=0, actor_id=0, policy_version=0
            )
            cu.on_minibatch_completed(completed(a.minibatch, gu=0, actor=0, attempt=a.attempt))
    chunk_prompts = {p for mb in chunk for p in mb.prompt_ids}
    assert sorted(sent) == sorted({p for mb in first for p in mb.prompt_ids} | chunk_prompts)
    replanned = [mb for mb in cu.schedule_now() if set(mb.prompt_ids) & chunk_prompts]
    # Appended as ids 2-3 (after the first chunk's 0-1), then re-planned: numbered after those.
    assert replanned and min(mb.minibatch_id for mb in replanned) >= len(first) + len(chunk)


# ---- evaluations ---------------------------------------------------------------------------------
def _eval_job(job_id: int, min_version: int = 0) -> EvalJob:
    settings = EvalSettings(sampling=SamplingConfig(max_tokens=4), num_samples_per_prompt=1, seed=0)
    return EvalJob(job_id=job_id, token_ids=((1, 2),), settings=settings, min_version=min_version)


def _decode(job_id: int) -> HeldOutDecode:
    return HeldOutDecode(
        job_id=job_id, responses=((3,),), finish_reasons=("stop",), weights_version=0, generate_s=0.1
    )


def test_an_evaluation_reaches_one_gu_and_keeps_a_finished_run_open_until_decoded() -> None:
    cu = make_cu(num_minibatches=2)
    cu.register_gu(0, 2)
    cu.register_gu(1, 2)
    cu.start()
    work = {g: cu.poll(g).assignments for g in (0, 1)}
    job = _eval_job(0)
    assert cu.submit_eval(job) == 0  # the lowest live GU
    with pytest.raises(ValueError, match="submitted twice"):
        cu.submit_eval(job)
    # The driver submits before its last step is done; every prompt then gets consumed.
    for g, assignments in work.items():
        for actor, a in enumerate(assignments):
            cu.request_start(a.minibatch.minibatch_id, attempt=0, gu_id=g, actor_id=actor, policy_version=0)
            cu.on_minibatch_completed(completed(a.minibatch, gu=g, actor=actor))
    assert cu.pop_global_batch(0) is not None
    cu.on_train_step_done(0)
    assert cu.is_finished()
    answer = cu.poll(0)
    assert answer.eval_jobs == (job,) and not answer.finished  # GU 0 must stay to decode it
    assert cu.poll(0).eval_jobs == () and cu.poll(1).eval_jobs == ()  # delivered once, to one GU
    assert cu.wait_eval(0, timeout_s=0.01) is None
    got: list[HeldOutDecode | None] = []
    waiter = threading.Thread(target=lambda: got.append(cu.wait_eval(0, timeout_s=WAKE_ONLY_S)), daemon=True)
    waiter.start()
    cu.on_eval_done(0, 0, _decode(0), None)
    waiter.join()
    assert got == [_decode(0)]
    assert cu.poll(0, wait_s=5.0).finished  # now the GUs may stop
    cu.on_eval_done(0, 0, _decode(0), None)  # a late duplicate is ignored


def test_an_evaluation_moves_off_a_failed_gu_and_fails_by_name_when_none_is_left() -> None:
    cu = make_cu()
    cu.register_gu(0, 1)
    cu.register_gu(1, 1)
    cu.start()
    assert cu.submit_eval(_eval_job(4)) == 0
    assert cu.poll(0).eval_jobs  # delivered, then GU 0 dies before decoding it
    cu.on_gu_failed(0)
    assert [j.job_id for j in cu.poll(1, wait_s=5.0).eval_jobs] == [4]
    cu.on_eval_done(1, 4, None, "snapshot v1 failed to convert")
    with pytest.raises(RuntimeError, match="evaluation 4 could not be decoded: snapshot v1 failed"):
        cu.wait_eval(4, timeout_s=1.0)
    cu.on_gu_failed(1)
    assert cu.submit_eval(_eval_job(5)) is None
    with pytest.raises(RuntimeError, match="no Generation Unit is left"):
        cu.wait_eval(5, timeout_s=1.0)


def test_an_evaluation_held_by_a_gu_whose_loop_ended_goes_to_another_or_fails() -> None:
    cu = make_cu()
    for g in (0, 1):
        cu.register_gu(g, 1)
    cu.start()
    assert cu.submit_eval(_eval_job(0)) == 0
    cu.on_gu_stopped(0)
    assert [j.job_id for j in cu.poll(1).eval_jobs] == [0]
    cu.on_gu_stopped(1)
    with pytest.raises(RuntimeError, match="no Generation Unit is left"):
        cu.wait_eval(0, timeout_s=1.0)
