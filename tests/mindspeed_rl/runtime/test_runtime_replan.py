"""Online re-plan of the unsent tail: Database.replace_unsent_tail and runtime.replan."""

from __future__ import annotations

import dataclasses

import pytest
from runtime_fakes import make_schedule

from mindspeed_rl.runtime.database import Database, MinibatchState
from mindspeed_rl.runtime.replan import TailPlan, replan_unsent


def _reverse_planner(prompt_ids: tuple[str, ...]) -> TailPlan:
    """One prompt per minibatch, in reverse order, two minibatches per group."""
    n = len(prompt_ids)
    return TailPlan(
        minibatches=tuple((i,) for i in reversed(range(n))),
        batch_groups=tuple(j // 2 for j in range(n)),
        loads=tuple(float(i) for i in range(n)),
    )


def test_tail_excludes_issued_and_the_rest_of_a_half_sent_group() -> None:
    db = Database(make_schedule(7, group_size=3))
    db.mark_issued(0, gu_id=0, now=0.0)
    assert [mb.minibatch_id for mb in db.unsent_tail()] == [3, 4, 5, 6]  # 1, 2 finish group 0


def test_replan_keeps_sent_work_and_places_every_prompt_once() -> None:
    schedule = make_schedule(7, group_size=3)
    all_prompts = sorted(p for mb in schedule for p in mb.prompt_ids)
    db = Database(schedule)
    db.mark_issued(0, gu_id=0, now=0.0)
    db.mark_started(0, actor_id=0, policy_version=0, now=0.0)
    outcome = replan_unsent(db, _reverse_planner)
    assert outcome.minibatches_before == 4 and outcome.minibatches_after == 8
    assert db.state(0) is MinibatchState.RUNNING
    db.check_invariants()
    sent = []
    while unit := db.next_to_send():
        for mb in unit:
            db.mark_issued(mb.minibatch_id, gu_id=0, now=1.0)
            sent.append(mb)
    # The half-sent group 0 goes out first, as planned; then the re-planned tail, reversed.
    assert [mb.minibatch_id for mb in sent[:2]] == [1, 2]
    tail_prompts = [p for mb in schedule[3:] for p in mb.prompt_ids]
    assert [mb.prompt_ids[0] for mb in sent[2:]] == tail_prompts[::-1]
    assert len({mb.batch_group_id for mb in sent[2:]}) == 4
    placed = sorted(p for i in db.minibatch_ids() for p in db.minibatch(i).prompt_ids)
    assert placed == all_prompts
    db.check_invariants()


def test_segments_are_replanned_apart() -> None:
    db = Database(make_schedule(6, prompts_per_minibatch=(1, 1), group_size=1))
    segment = {f"p{i}": i // 3 for i in range(6)}
    replan_unsent(db, _reverse_planner, segment_of=lambda mb: segment[mb.prompt_ids[0]])
    order = []
    while unit := db.next_to_send():
        for mb in unit:
            db.mark_issued(mb.minibatch_id, gu_id=0, now=0.0)
            order.append(mb.prompt_ids[0])
    assert order == ["p2", "p1", "p0", "p5", "p4", "p3"]


def test_replace_rejects_lost_prompts_and_reused_ids() -> None:
    schedule = make_schedule(4, group_size=2)
    db = Database(schedule)
    db.mark_issued(0, gu_id=0, now=0.0)
    tail = db.unsent_tail()
    assert [mb.minibatch_id for mb in tail] == [2, 3]
    with pytest.raises(ValueError, match="exactly the .* prompts of the unsent tail"):
        db.replace_unsent_tail(tail[:1])
    clash = [dataclasses.replace(mb, batch_group_id=0) for mb in tail]
    with pytest.raises(ValueError, match="reuses an id or group"):
        db.replace_unsent_tail(clash)
    db.check_invariants()


def test_planner_that_drops_a_prompt_is_refused() -> None:
    db = Database(make_schedule(4, group_size=2))

    def drop_one(prompt_ids: tuple[str, ...]) -> TailPlan:
        return TailPlan(minibatches=((0,),), batch_groups=(0,), loads=(1.0,))

    with pytest.raises(ValueError, match="exactly once"):
        replan_unsent(db, drop_one)
    db.check_invariants()
