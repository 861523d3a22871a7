from __future__ import annotations

import dataclasses

import pytest
from runtime_fakes import make_schedule

from mindspeed_rl.runtime.database import Database, MinibatchState


def _issue_all(db: Database, gu_id: int, now: float = 0.0) -> list[int]:
    issued = []
    while unit := db.next_to_send():
        for mb in unit:
            db.mark_issued(mb.minibatch_id, gu_id, now)
            issued.append(mb.minibatch_id)
    return issued


def test_supplies_minibatches_in_schedule_order_by_whole_groups() -> None:
    schedule = make_schedule(7, group_size=3)
    db = Database(list(reversed(schedule)))  # the given order does not matter, order_index does
    assert [mb.minibatch_id for mb in db.next_to_send()] == [0, 1, 2]
    assert [mb.minibatch_id for mb in db.next_to_send(whole_group=False)] == [0]
    db.mark_issued(0, gu_id=0, now=0.0)
    assert [mb.minibatch_id for mb in db.next_to_send()] == [1, 2]  # rest of the open group
    assert _issue_all(db, gu_id=0) == [1, 2, 3, 4, 5, 6]
    assert db.next_to_send() == ()
    db.check_invariants()


def test_failed_work_is_requeued_first_in_schedule_order() -> None:
    db = Database(make_schedule(9, group_size=3))
    for mb_id in range(6):
        db.mark_issued(mb_id, gu_id=mb_id % 2, now=0.0)
    db.mark_started(4, actor_id=0, policy_version=0, now=1.0)
    db.mark_started(1, actor_id=3, policy_version=0, now=1.0)
    assert db.fail_actor(gu_id=1, actor_id=3) == [1]
    assert db.state(3) is MinibatchState.ISSUED  # queued at the GU, not on the dead actor
    assert db.fail_gu(gu_id=0) == [0, 2, 4]
    db.check_invariants()
    assert [mb.minibatch_id for mb in db.next_to_send()] == [0, 1, 2, 4]  # before group 2 (6..8)
    with pytest.raises(AssertionError, match="out of order"):
        db.mark_issued(2, gu_id=1, now=2.0)
    assert db.mark_issued(0, gu_id=1, now=2.0) == 1  # second attempt
    assert db.num_requeued == 4 and db.num_reissued == 1
    db.check_invariants()


def test_every_minibatch_is_in_exactly_one_state_through_its_life() -> None:
    db = Database(make_schedule(3, group_size=3))
    db.mark_issued(0, gu_id=0, now=0.0)
    db.mark_started(0, actor_id=0, policy_version=0, now=0.5)
    record = db.mark_completed(0)
    assert (record.gu_id, record.actor_id, record.started_at) == (0, 0, 0.5)
    assert db.state(0) is MinibatchState.COMPLETED and db.num_completed == 1
    with pytest.raises(AssertionError, match="not running"):
        db.mark_completed(0)
    assert db.fail_gu(0) == []  # completed work is never re-queued
    db._pending.append(0)  # corrupt the bookkeeping: the check must notice
    with pytest.raises(AssertionError):
        db.check_invariants()


def test_rejects_schedules_that_would_lose_or_duplicate_prompts() -> None:
    schedule = make_schedule(4, group_size=2)
    with pytest.raises(ValueError, match="more than one minibatch"):
        Database([*schedule, dataclasses.replace(schedule[0], minibatch_id=9, order_index=9)])
    with pytest.raises(ValueError, match="repeats a minibatch_id"):
        Database([schedule[0], dataclasses.replace(schedule[1], minibatch_id=0)])
    with pytest.raises(ValueError, match="not contiguous"):
        Database([dataclasses.replace(mb, batch_group_id=mb.minibatch_id % 2) for mb in schedule])
    with pytest.raises(ValueError, match="unknown minibatch"):
        Database(schedule).state(99)
