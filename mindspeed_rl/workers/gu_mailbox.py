"""What the Control Unit owes each Generation Unit: its undelivered assignments and what news
it has not been told yet, the bookkeeping behind ``ControlUnit.poll``'s long-poll.

Delivery is pull-based (see ``workers/control_unit.py``): assignments wait in a GU's outbox until
its next ``exchange`` or ``poll`` answer takes them. Two counters per GU say how much has changed
for it: ``news`` (anything it might act on: new work, a pause flip, a trainer step) and ``urgent``
(what it must hear even while all its actors are busy: a new snapshot, the end of the run, a
failure elsewhere). An answer records the counters it reflected, so a waiting poll returns only
for news that no earlier answer (an ``exchange`` reply included) already carried.

Pure bookkeeping, no lock: every method is called with the Control Unit's lock held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mindspeed_rl.runtime.records import Assignment


@dataclass(frozen=True, slots=True)
class Delivery:
    """One answer's share of a GU's mailbox."""

    assignments: tuple[Assignment, ...]
    known: bool
    """False for a GU that failed or never registered: it must stop."""
    seq: int
    """Answers handed to this GU so far (this one included): the GU applies only newer ones."""


class GuMailboxes:
    def __init__(self) -> None:
        self._outbox: dict[int, list[Assignment]] = {}
        self._news: dict[int, int] = {}
        self._urgent: dict[int, int] = {}
        self._told: dict[int, tuple[int, int, bool]] = {}
        """gu -> (news, urgent, paused) as its last answer reflected them."""
        self._seq: dict[int, int] = {}
        self._forgotten: set[int] = set()

    def register(self, gu_id: int) -> None:
        self._outbox.setdefault(gu_id, [])
        self._news.setdefault(gu_id, 0)
        self._urgent.setdefault(gu_id, 0)
        self._told.setdefault(gu_id, (-1, -1, False))  # its first poll answers at once

    def forget(self, gu_id: int) -> bool:
        """Drop a failed GU's undelivered work (the ControlLoop re-queues it); False if already."""
        if gu_id in self._forgotten:
            return False
        self._forgotten.add(gu_id)
        self._outbox.pop(gu_id, None)
        return True

    def is_forgotten(self, gu_id: int) -> bool:
        return gu_id in self._forgotten

    def post(self, assignment: Assignment) -> None:
        if assignment.gu_id not in self._outbox:
            raise AssertionError(f"dispatched to unknown GU {assignment.gu_id}")
        self._outbox[assignment.gu_id].append(assignment)

    def every_gu(self) -> set[int]:
        """Every GU ever registered (a forgotten one too: it must still hear the end)."""
        return set(self._news)

    def tell(self, gu_ids: Iterable[int], *, urgent: bool = False) -> None:
        """Something changed for ``gu_ids``; ``urgent``: they must hear it even while busy."""
        for gu_id in gu_ids:
            self._news[gu_id] += 1
            if urgent:
                self._urgent[gu_id] += 1

    def worth_answering(
        self, gu_id: int, *, finished: bool, has_idle_actor: Callable[[], bool], paused: Callable[[], bool]
    ) -> bool:
        """Whether a waiting poll of ``gu_id`` should return now."""
        if gu_id not in self._outbox or finished:
            return True  # failed, never registered, or done: it must hear it to stop
        told_news, told_urgent, told_paused = self._told[gu_id]
        if self._urgent[gu_id] != told_urgent:
            return True
        if self._news[gu_id] == told_news or not has_idle_actor():
            return False  # a busy GU hears ordinary news in its next exchange answer
        # Told it is paused and still paused: no start can be granted, so new work and trainer
        # steps wait for the resume (which is news of its own).
        return not (told_paused and paused())

    def take(self, gu_id: int, *, paused: bool) -> Delivery:
        """Empty ``gu_id``'s outbox into an answer and note what that answer tells it."""
        known = gu_id not in self._forgotten and gu_id in self._outbox
        work: tuple[Assignment, ...] = ()
        if known:
            work, self._outbox[gu_id] = tuple(self._outbox[gu_id]), []
            self._told[gu_id] = (self._news[gu_id], self._urgent[gu_id], paused)
        self._seq[gu_id] = seq = self._seq.get(gu_id, 0) + 1
        return Delivery(assignments=work, known=known, seq=seq)
