"""The Generation Unit policy on its own: every rule, with a scripted start gate."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from runtime_fakes import make_schedule

from mindspeed_rl.models.rollout.base import SamplingConfig
from mindspeed_rl.runtime import Assignment, SnapshotInfo, StartDecision, StartRefusal
from mindspeed_rl.runtime.gu_policy import (
    Drop,
    Evaluate,
    EvalUnavailable,
    GuPolicy,
    Reload,
    Start,
    Wait,
    WaitReason,
)
from mindspeed_rl.workers.evaluator import EvalJob, EvalSettings


def _assignments(n: int) -> list[Assignment]:
    return [Assignment(minibatch=mb, gu_id=0, attempt=0, issued_at=0.0) for mb in make_schedule(n)]


def _snapshot(version: int) -> SnapshotInfo:
    return SnapshotInfo(version=version, path=f"/train/v{version}", created_at=float(version))


class Gate:
    """Answers ``request_start`` from a rule and records every question."""

    def __init__(self, rule: Callable[[int, int], StartRefusal | None] = lambda mb, v: None) -> None:
        self.rule = rule
        self.asked: list[tuple[int, int, int]] = []  # (minibatch id, actor, version)

    def __call__(self, assignment: Assignment, *, actor_id: int, policy_version: int) -> StartDecision:
        self.asked.append((assignment.minibatch.minibatch_id, actor_id, policy_version))
        refusal = self.rule(assignment.minibatch.minibatch_id, policy_version)
        return StartDecision(granted=refusal is None, refusal=refusal)


def _converted(policy: GuPolicy, version: int) -> None:
    policy.on_snapshot_published(_snapshot(version))
    target = policy.next_conversion()
    assert target is not None and target.version == version
    policy.on_converted(version, path=f"/gu/v{version}")


def test_idle_actors_start_the_queue_head_with_the_version_they_hold() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0, 1, 2])
    policy.add_assignments(_assignments(2))
    gate = Gate()
    actions = policy.next_actions(paused=False, request_start=gate)
    assert [type(a) for a in actions] == [Start, Start, Wait]
    assert gate.asked == [(0, 0, 0), (1, 1, 0)]
    assert actions[2] == Wait(actor_id=2, reason=WaitReason.EMPTY_QUEUE)
    assert policy.busy_actor_ids() == [0, 1] and not policy.queue
    # Busy actors are not asked about again.
    assert policy.next_actions(paused=False, request_start=gate) == [
        Wait(actor_id=2, reason=WaitReason.EMPTY_QUEUE)
    ]
    assert policy.on_generation_done(0).minibatch.minibatch_id == 0
    assert policy.slots[0].idle


def test_pause_stops_every_idle_actor_without_asking_the_cu() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0, 1])
    policy.add_assignments(_assignments(3))
    _converted(policy, 1)
    gate = Gate()
    actions = policy.next_actions(paused=True, request_start=gate)
    assert actions == [Wait(actor_id=0, reason=WaitReason.PAUSED), Wait(actor_id=1, reason=WaitReason.PAUSED)]
    assert gate.asked == []  # and no reload while paused: it would be one per snapshot of the pause


@pytest.mark.parametrize("refusal", [StartRefusal.BACKPRESSURE, StartRefusal.POLICY_LAG])
def test_backpressure_and_lag_stop_the_round_after_one_question(refusal: StartRefusal) -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0, 1, 2])
    policy.add_assignments(_assignments(3))
    gate = Gate(lambda mb, v: refusal)
    actions = policy.next_actions(paused=False, request_start=gate)
    reason = WaitReason(refusal.value)
    assert actions == [Wait(actor_id=a, reason=reason) for a in range(3)]
    assert len(gate.asked) == 1 and len(policy.queue) == 3


def test_revoked_heads_are_dropped_and_the_next_head_is_asked() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0])
    policy.add_assignments(_assignments(3))
    gate = Gate(lambda mb, v: StartRefusal.REVOKED if mb < 2 else None)
    actions = policy.next_actions(paused=False, request_start=gate)
    assert [type(a) for a in actions] == [Drop, Drop, Start]
    assert isinstance(actions[2], Start) and actions[2].assignment.minibatch.minibatch_id == 2
    # All revoked: the actor waits on an empty queue.
    policy = GuPolicy(gu_id=0, actor_ids=[0])
    policy.add_assignments(_assignments(1))
    assert policy.next_actions(paused=False, request_start=Gate(lambda mb, v: StartRefusal.REVOKED))[
        -1
    ] == Wait(actor_id=0, reason=WaitReason.EMPTY_QUEUE)


def test_an_idle_actor_reloads_to_the_newest_converted_before_starting() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0])
    policy.add_assignments(_assignments(2))
    _converted(policy, 2)
    gate = Gate()
    assert policy.next_actions(paused=False, request_start=gate) == [
        Reload(actor_id=0, version=2, path="/gu/v2")
    ]
    assert gate.asked == [] and not policy.slots[0].idle
    policy.on_reloaded(0, 2, ok=True)
    actions = policy.next_actions(paused=False, request_start=gate)
    assert isinstance(actions[0], Start) and actions[0].policy_version == 2
    assert gate.asked == [(0, 0, 2)]


def test_no_reload_with_nothing_to_start() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0])
    _converted(policy, 1)
    assert policy.next_actions(paused=False, request_start=Gate()) == [
        Wait(actor_id=0, reason=WaitReason.EMPTY_QUEUE)
    ]


def test_one_reload_per_minibatch_unless_the_lag_bound_needs_a_newer_one() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0])
    policy.add_assignments(_assignments(3))
    _converted(policy, 1)
    policy.next_actions(paused=False, request_start=Gate())
    _converted(policy, 2)  # converted while the actor loaded v1
    policy.on_reloaded(0, 1, ok=True)
    actions = policy.next_actions(paused=False, request_start=Gate())
    assert isinstance(actions[0], Start) and actions[0].policy_version == 1  # no second reload
    policy.on_generation_done(0)
    # Its next minibatch: reload first.
    assert policy.next_actions(paused=False, request_start=Gate()) == [
        Reload(actor_id=0, version=2, path="/gu/v2")
    ]
    policy.on_reloaded(0, 2, ok=True)
    # Just loaded v2, but the CU refuses v2 for lag while v3 is converted: reload again.
    for refusal in (StartRefusal.STALE_WEIGHTS, StartRefusal.POLICY_LAG):
        gate = Gate(lambda mb, v, r=refusal: r if v < 3 else None)
        probe = GuPolicy(gu_id=0, actor_ids=[0])
        probe.add_assignments(_assignments(1))
        _converted(probe, 2)
        probe.next_actions(paused=False, request_start=Gate())
        probe.on_reloaded(0, 2, ok=True)
        _converted(probe, 3)
        assert probe.next_actions(paused=False, request_start=gate) == [
            Reload(actor_id=0, version=3, path="/gu/v3")
        ]
    # Stale with nothing newer converted: wait for the next conversion.
    gate = Gate(lambda mb, v: StartRefusal.STALE_WEIGHTS)
    stale = GuPolicy(gu_id=0, actor_ids=[0])
    stale.add_assignments(_assignments(1))
    assert stale.next_actions(paused=False, request_start=gate) == [
        Wait(actor_id=0, reason=WaitReason.STALE_WEIGHTS)
    ]


def test_a_version_the_actor_rejected_is_not_offered_again() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0])
    policy.add_assignments(_assignments(2))
    _converted(policy, 1)
    policy.next_actions(paused=False, request_start=Gate())
    policy.on_reloaded(0, 1, ok=False)
    gate = Gate()
    actions = policy.next_actions(paused=False, request_start=gate)
    assert isinstance(actions[0], Start) and actions[0].policy_version == 0
    assert policy.slots[0].rejected_version == 1


def test_conversion_takes_the_newest_published_one_at_a_time_and_never_a_rejected_one() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0])
    assert policy.next_conversion() is None
    policy.on_snapshot_published(_snapshot(1))
    first = policy.next_conversion()
    assert first is not None and first.version == 1
    policy.on_snapshot_published(_snapshot(2))
    policy.on_snapshot_published(_snapshot(3))
    policy.on_snapshot_published(_snapshot(2))  # a late, older announcement is ignored
    assert policy.next_conversion() is None  # one conversion at a time
    policy.on_converted(1, path="/gu/v1")
    newest = policy.next_conversion()
    assert newest is not None and newest.version == 3  # v2 skipped
    policy.on_converted(3, path=None)  # defective snapshot
    assert policy.converted is not None and policy.converted.version == 1
    assert policy.next_conversion() is None and policy.conversion_rejected == {3}
    policy.on_snapshot_published(_snapshot(4))
    again = policy.next_conversion()
    assert again is not None and again.version == 4


def test_misreported_transitions_are_errors() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0])
    with pytest.raises(ValueError, match="nothing was converting"):
        policy.on_converted(1, path="/x")
    with pytest.raises(ValueError, match="never started"):
        policy.on_generation_done(0)
    with pytest.raises(ValueError, match="reload of v1"):
        policy.on_reloaded(0, 1, ok=True)
    assert policy.on_actor_died(0) is None
    with pytest.raises(ValueError, match="no live actor 0"):
        policy.on_generation_done(0)


def test_a_dead_actor_hands_back_its_minibatch() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0, 1])
    policy.add_assignments(_assignments(1))
    policy.next_actions(paused=False, request_start=Gate())
    lost = policy.on_actor_died(0)
    assert lost is not None and lost.minibatch.minibatch_id == 0
    assert list(policy.slots) == [1]


def test_work_received_late_from_an_older_answer_is_queued_ahead() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0])
    older, newer = _assignments(4)[:2], _assignments(4)[2:]
    policy.add_assignments(newer)
    policy.add_assignments(older, ahead=True)
    assert list(policy.queue) == [*older, *newer]
    assert policy.next_actions(paused=False, request_start=Gate())[0] == Start(
        actor_id=0, assignment=older[0], policy_version=0
    )


def test_reissued_work_goes_before_what_is_queued() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0])
    fresh = _assignments(3)
    policy.add_assignments(fresh[1:])
    retry = dataclasses.replace(fresh[0], attempt=1)
    policy.add_assignments([retry])
    assert [a.minibatch.minibatch_id for a in policy.queue] == [0, 1, 2]


def test_a_replacement_actor_joins_idle_with_the_initial_weights() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0, 1])
    _converted(policy, 2)
    policy.on_actor_died(0)
    policy.add_actor(0)
    assert list(policy.slots) == [0, 1] and policy.slots[0].idle and policy.slots[0].version == 0
    policy.add_assignments(_assignments(1))
    assert policy.next_actions(paused=False, request_start=Gate())[0] == Reload(
        actor_id=0, version=2, path="/gu/v2"
    )
    with pytest.raises(ValueError, match="already has a live actor 1"):
        policy.add_actor(1)


def test_a_partial_rollout_reports_the_newer_weights_it_loaded() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0, 1])
    policy.add_assignments(_assignments(2))
    policy.next_actions(paused=False, request_start=Gate())  # both decode on v0
    _converted(policy, 2)
    policy.on_generation_done(0, held_version=2)  # it reloaded mid-minibatch
    assert policy.slots[0].version == 2 and policy.slots[0].idle
    with pytest.raises(ValueError, match="only moves to newer weights"):
        policy.on_generation_done(1, held_version=-1)


# ---- evaluations ---------------------------------------------------------------------------------
def _job(job_id: int, min_version: int) -> EvalJob:
    settings = EvalSettings(sampling=SamplingConfig(max_tokens=4), num_samples_per_prompt=1, seed=0)
    return EvalJob(job_id=job_id, token_ids=((1, 2),), settings=settings, min_version=min_version)


def test_an_evaluation_goes_to_one_idle_actor_holding_its_version_before_queued_work() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0, 1])
    policy.add_assignments(_assignments(3))
    job = _job(0, 0)
    policy.add_eval(job)
    policy.add_eval(job)  # a repeated delivery is one job
    gate = Gate()
    # Paused and refusing every start: the evaluation still goes out (it trains nothing).
    actions = policy.next_actions(paused=True, request_start=gate)
    assert actions == [Evaluate(actor_id=0, job=job), Wait(actor_id=1, reason=WaitReason.PAUSED)]
    assert not policy.evals and policy.busy_actor_ids() == [0]
    assert [type(a) for a in policy.next_actions(paused=False, request_start=gate)] == [Start]
    assert policy.on_eval_done(0) == job and policy.slots[0].idle
    with pytest.raises(ValueError, match="never given"):
        policy.on_eval_done(0)


def test_an_evaluation_of_newer_weights_waits_for_them_then_reloads_one_actor() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0, 1])
    job = _job(5, 2)
    policy.add_eval(job)
    gate = Gate()
    # v2 is not converted yet: nothing to do for the job, generation is not held up.
    policy.add_assignments(_assignments(1))
    assert [type(a) for a in policy.next_actions(paused=False, request_start=gate)] == [Start, Wait]
    _converted(policy, 2)
    actions = policy.next_actions(paused=False, request_start=gate)
    assert actions == [
        Reload(actor_id=1, version=2, path="/gu/v2"),
    ]
    assert policy.next_actions(paused=False, request_start=gate) == []  # one actor loads it, once
    policy.on_reloaded(1, 2, ok=True)
    assert policy.next_actions(paused=False, request_start=gate) == [Evaluate(actor_id=1, job=job)]


def test_an_evaluation_outlives_its_actor_and_fails_when_its_version_cannot_exist() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0, 1])
    job = _job(1, 0)
    policy.add_eval(job)
    assert policy.next_actions(paused=False, request_start=Gate()) == [
        Evaluate(actor_id=0, job=job),
        Wait(actor_id=1, reason=WaitReason.EMPTY_QUEUE),
    ]
    assert policy.on_actor_died(0) is None
    assert list(policy.evals) == [job]  # back at the head, for the next idle actor
    assert policy.next_actions(paused=False, request_start=Gate())[0] == Evaluate(actor_id=1, job=job)
    policy.on_eval_done(1)

    policy.on_snapshot_published(_snapshot(3))
    assert policy.next_conversion() is not None
    policy.on_converted(3, path=None)  # v3 is defective
    doomed = _job(2, 3)
    policy.add_eval(doomed)
    (action, _) = policy.next_actions(paused=False, request_start=Gate())
    assert action == EvalUnavailable(job=doomed, reason="snapshot v3 failed to convert")
    assert not policy.evals


def test_an_evaluation_every_actor_refuses_the_weights_of_is_unavailable() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0])
    _converted(policy, 1)
    job = _job(0, 1)
    policy.add_eval(job)
    assert policy.next_actions(paused=False, request_start=Gate()) == [
        Reload(actor_id=0, version=1, path="/gu/v1")
    ]
    policy.on_reloaded(0, 1, ok=False)
    (action, _) = policy.next_actions(paused=False, request_start=Gate())
    assert action == EvalUnavailable(job=job, reason="every actor refused snapshot v1")


def test_an_evaluation_waits_while_its_only_actor_is_being_replaced() -> None:
    policy = GuPolicy(gu_id=0, actor_ids=[0])
    _converted(policy, 2)
    job = _job(0, 2)
    policy.add_eval(job)
    assert policy.next_actions(paused=False, request_start=Gate()) == [
        Reload(actor_id=0, version=2, path="/gu/v2")
    ]
    policy.on_reloaded(0, 2, ok=True)
    assert policy.next_actions(paused=False, request_start=Gate()) == [Evaluate(actor_id=0, job=job)]
    policy.on_actor_died(0)  # no actor left while its replacement starts: not a refusal
    assert policy.next_actions(paused=False, request_start=Gate()) == [] and list(policy.evals) == [job]
    policy.add_actor(0)  # the replacement holds the initial weights: it reloads, then decodes
    assert policy.next_actions(paused=False, request_start=Gate()) == [
        Reload(actor_id=0, version=2, path="/gu/v2")
    ]
