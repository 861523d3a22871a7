from __future__ import annotations

import dataclasses

from runtime_fakes import make_schedule

from mindspeed_rl.runtime import FakeClock
from mindspeed_rl.runtime.database import Database
from mindspeed_rl.runtime.sender import Sender


def _sender(num_minibatches: int, *, low: int, high: int, group_size: int, loads: list[float] | None = None):
    schedule = make_schedule(num_minibatches, group_size=group_size)
    if loads is not None:
        schedule = [dataclasses.replace(mb, predicted_load=load) for mb, load in zip(schedule, loads)]
    db = Database(schedule)
    return Sender(queue_low=low, queue_high=high, database=db, clock=FakeClock()), db


def test_refills_a_gu_to_high_only_after_it_drops_to_low() -> None:
    sender, db = _sender(40, low=2, high=5, group_size=1)
    sender.register_gu(0, num_actors=1)
    first = sender.dispatch()
    assert [a.minibatch.minibatch_id for a in first] == [0, 1, 2, 3, 4]
    for mb_id in (0, 1):  # queue 5 -> 3: above low, no refill
        db.mark_started(mb_id, actor_id=0, policy_version=0, now=0.0)
        sender.on_started(mb_id, 0)
    assert sender.dispatch() == []
    db.mark_started(2, actor_id=1, policy_version=0, now=0.0)
    sender.on_started(2, 0)  # queue 2 == low: refill up to high
    assert [a.minibatch.minibatch_id for a in sender.dispatch()] == [5, 6, 7]
    gu = sender.gu(0)
    assert gu is not None and len(gu.queued) == 5


def test_batch_groups_are_dealt_whole_and_spread_by_load_per_actor() -> None:
    loads = [100.0, 10.0, 10.0, 10.0, 50.0, 50.0]
    sender, _ = _sender(6, low=0, high=1, group_size=3, loads=loads)
    sender.register_gu(0, num_actors=1)
    sender.register_gu(1, num_actors=2)
    assignments = sender.dispatch()
    # Group 0 is dealt whole although each GU asked for one minibatch only; group 1 waits.
    assert [(a.minibatch.minibatch_id, a.gu_id) for a in assignments] == [(0, 0), (1, 1), (2, 1)]
    assert {a.minibatch.batch_group_id for a in assignments} == {0}
    gu0, gu1 = sender.gu(0), sender.gu(1)
    assert gu0 is not None and gu1 is not None
    assert gu0.load_per_actor == 100.0 and gu1.load_per_actor == 10.0


def test_overshoot_above_high_stays_below_one_group() -> None:
    sender, _ = _sender(30, low=1, high=2, group_size=5)
    sender.register_gu(0, num_actors=1)
    sender.dispatch()
    gu = sender.gu(0)
    assert gu is not None and 2 <= len(gu.queued) < 2 + 5


def test_reissues_go_first_and_one_at_a_time() -> None:
    sender, db = _sender(12, low=1, high=3, group_size=3)
    sender.register_gu(0, num_actors=1)
    sender.register_gu(1, num_actors=1)
    first = sender.dispatch()
    lost = db.fail_gu(0)
    for mb_id in lost:
        sender.on_finished(mb_id, 0)
    sender.remove_gu(0)
    gu1 = sender.gu(1)
    assert gu1 is not None
    for mb_id in list(gu1.queued):  # GU 1 starts everything, so it asks for more
        db.mark_started(mb_id, actor_id=0, policy_version=0, now=0.0)
        sender.on_started(mb_id, 1)
    refill = sender.dispatch()
    assert len(lost) == 5
    # Re-issues come first, in schedule order, and respect ``high`` exactly (no group overshoot).
    assert [a.minibatch.minibatch_id for a in refill] == sorted(lost)[:3]
    assert all(a.attempt == 1 for a in refill)
    assert len(gu1.queued) == 3
    assert [mb.minibatch_id for mb in db.next_to_send()] == sorted(lost)[3:]  # still ahead of new work
    assert sender.num_assigned == {0: 5, 1: sum(a.gu_id == 1 for a in first) + 3}


def test_no_gus_means_nothing_is_issued() -> None:
    sender, db = _sender(3, low=1, high=2, group_size=3)
    assert sender.dispatch() == []
    assert db.has_unsent()
