"""The CU's per-GU delivery bookkeeping: who must hear what, and when a waiting poll returns."""

from __future__ import annotations

import pytest

from mindspeed_rl.runtime.records import Assignment, ScheduledMinibatch
from mindspeed_rl.workers.gu_mailbox import GuMailboxes


def _assignment(gu_id: int, mb: int) -> Assignment:
    minibatch = ScheduledMinibatch(
        minibatch_id=mb, prompt_ids=(f"p{mb}",), batch_group_id=mb, predicted_load=1.0, order_index=mb
    )
    return Assignment(gu_id=gu_id, minibatch=minibatch, attempt=0, issued_at=0.0)


def _worth(mail: GuMailboxes, gu_id: int, *, idle: bool = True, paused: bool = False, finished=False) -> bool:
    return mail.worth_answering(gu_id, finished=finished, has_idle_actor=lambda: idle, paused=lambda: paused)


def test_a_new_gu_is_answered_at_once_and_then_waits_for_news() -> None:
    mail = GuMailboxes()
    mail.register(0)
    assert _worth(mail, 0)
    mail.take(0, paused=False)
    assert not _worth(mail, 0)
    mail.tell({0})
    assert _worth(mail, 0)
    assert not _worth(mail, 0, idle=False), "a busy GU hears ordinary news in its next exchange"


def test_urgent_news_wakes_a_busy_gu_and_one_answer_consumes_it() -> None:
    mail = GuMailboxes()
    mail.register(0)
    mail.take(0, paused=False)
    mail.tell({0}, urgent=True)
    assert _worth(mail, 0, idle=False)
    mail.take(0, paused=False)
    assert not _worth(mail, 0, idle=False)


def test_a_gu_told_it_is_paused_waits_for_the_resume() -> None:
    mail = GuMailboxes()
    mail.register(0)
    mail.take(0, paused=True)
    mail.tell({0})  # e.g. new work while the queue is over its limit
    assert not _worth(mail, 0, paused=True)
    assert _worth(mail, 0, paused=False)


def test_assignments_are_delivered_once_in_order_with_rising_seq() -> None:
    mail = GuMailboxes()
    mail.register(0)
    mail.register(1)
    for mb in (3, 1, 2):
        mail.post(_assignment(0, mb))
    mail.post(_assignment(1, 7))
    first = mail.take(0, paused=False)
    assert [a.minibatch.minibatch_id for a in first.assignments] == [3, 1, 2]
    assert first.known and first.seq == 1
    second = mail.take(0, paused=False)
    assert second.assignments == () and second.seq == 2
    assert [a.minibatch.minibatch_id for a in mail.take(1, paused=False).assignments] == [7]


def test_a_forgotten_gu_drops_its_work_and_is_told_to_stop() -> None:
    mail = GuMailboxes()
    mail.register(0)
    mail.post(_assignment(0, 1))
    assert mail.forget(0)
    assert not mail.forget(0), "a second failure report is a no-op"
    assert mail.is_forgotten(0) and 0 in mail.every_gu()
    assert _worth(mail, 0, idle=False)
    delivery = mail.take(0, paused=False)
    assert not delivery.known and delivery.assignments == ()
    with pytest.raises(AssertionError, match="unknown GU 0"):
        mail.post(_assignment(0, 2))


def test_the_end_of_the_run_answers_every_poll() -> None:
    mail = GuMailboxes()
    mail.register(0)
    mail.take(0, paused=False)
    assert _worth(mail, 0, idle=False, finished=True)
    assert _worth(mail, 5), "a GU that never registered must hear it to stop"
