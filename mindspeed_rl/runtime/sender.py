"""The Generation Sender's dispatch policy: what goes to which GU's input queue, and when.

* Watermarks. A GU whose input queue (issued, not yet started) drops to ``low`` minibatches is
  refilled until it holds ``high``. The low mark hides CU→GU latency; the high mark keeps work
  uncommitted so another GU can still take it.
* Batch groups are dispatch units. A group is dealt out in one go once any GU needs work, even if
  that lifts a GU's queue above ``high`` (by less than one group), so the group's minibatches
  decode at the same time and their balanced total load reaches the queue as one smooth wave;
  splitting a group across refill rounds would reintroduce the sorting bubbles ASP removes.
* Spreading. Within a group, minibatches go in schedule order, each to the refilling GU with the
  least outstanding predicted load per actor (queued + running), so one group's load is spread
  over GUs instead of piling on whichever GU asked first.
* Re-issues first and one at a time: they are not a group, so they respect ``high`` exactly.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from mindspeed_rl.runtime.clock import Clock
from mindspeed_rl.runtime.database import Database, MinibatchState
from mindspeed_rl.runtime.records import Assignment, ScheduledMinibatch


@dataclass(slots=True, kw_only=True)
class GuState:
    num_actors: int
    queued: dict[int, float] = field(default_factory=dict)
    """Issued but not started: minibatch id -> predicted load, in issue order."""
    running: dict[int, float] = field(default_factory=dict)
    refilling: bool = True

    @property
    def load_per_actor(self) -> float:
        total = sum(self.queued.values()) + sum(self.running.values())
        return total / max(1, self.num_actors)


class Sender:
    def __init__(self, *, queue_low: int, queue_high: int, database: Database, clock: Clock) -> None:
        if not 0 <= queue_low < queue_high:
            raise ValueError(f"need 0 <= queue_low < queue_high, got {queue_low} and {queue_high}.")
        self.queue_low, self.queue_high = queue_low, queue_high
        self._db = database
        self._clock = clock
        self._gus: dict[int, GuState] = {}
        self.num_assigned: dict[int, int] = {}
        """Minibatches ever assigned per GU (including ones later re-queued)."""

    # ---- GU membership ---------------------------------------------------------------------
    def register_gu(self, gu_id: int, num_actors: int) -> None:
        """Add a GU, or update its actor count if it is already known."""
        if num_actors < 1:
            raise ValueError(f"GU {gu_id} reports {num_actors} actors; a GU needs at least one actor.")
        if gu_id in self._gus:
            self._gus[gu_id].num_actors = num_actors
        else:
            self._gus[gu_id] = GuState(num_actors=num_actors)
            self.num_assigned.setdefault(gu_id, 0)

    def remove_gu(self, gu_id: int) -> None:
        self._gus.pop(gu_id, None)

    def lose_actor(self, gu_id: int) -> int:
        """One actor of ``gu_id`` is gone; returns how many the GU has left."""
        gu = self._gus[gu_id]
        gu.num_actors -= 1
        return gu.num_actors

    def gu(self, gu_id: int) -> GuState | None:
        return self._gus.get(gu_id)

    @property
    def gu_ids(self) -> list[int]:
        return sorted(self._gus)

    # ---- bookkeeping driven by the ControlLoop ----------------------------------------------
    def on_started(self, minibatch_id: int, gu_id: int) -> None:
        gu = self._gus[gu_id]
        gu.running[minibatch_id] = gu.queued.pop(minibatch_id)

    def on_finished(self, minibatch_id: int, gu_id: int) -> None:
        """The minibatch left the GU (completed, or its actor failed)."""
        gu = self._gus.get(gu_id)
        if gu is not None:
            gu.running.pop(minibatch_id, None)
            gu.queued.pop(minibatch_id, None)

    # ---- dispatch ----------------------------------------------------------------------------
    def dispatch(self, *, urgent: Collection[int] = ()) -> list[Assignment]:
        """Fill the GUs that need work, following the schedule; returns the new assignments.

        ``urgent``: re-queued minibatches that go out at once, past the marks, when they head the
        send order (a minibatch whose attempt failed: see the comment below)."""
        assignments: list[Assignment] = []
        while True:
            self._update_refilling()
            targets = [g for g, state in self._gus.items() if state.refilling]
            unit = self._db.next_to_send(whole_group=True)
            head = unit[0].minibatch_id if unit else None
            if (
                head is not None
                and head in urgent
                and self._gus
                and self._db.state(head) is MinibatchState.REQUEUED
            ):
                # A failed attempt is retried at once, past the marks: a GU holding a full queue
                # would otherwise start its other work first, and a poison minibatch would spread
                # its failures over those (spending every restart) instead of meeting its limit.
                assignments.append(self._assign(unit[0], self._least_loaded(list(self._gus))))
                continue
            if not targets or not unit:
                return assignments
            if self._db.state(unit[0].minibatch_id) is MinibatchState.REQUEUED:
                unit = unit[:1]
            for mb in unit:
                assignments.append(self._assign(mb, self._least_loaded(targets)))

    def _update_refilling(self) -> None:
        for state in self._gus.values():
            if len(state.queued) <= self.queue_low:
                state.refilling = True
            elif len(state.queued) >= self.queue_high:
                state.refilling = False

    def _least_loaded(self, targets: list[int]) -> int:
        return min(targets, key=lambda g: (self._gus[g].load_per_actor, len(self._gus[g].queued), g))

    def _assign(self, mb: ScheduledMinibatch, gu_id: int) -> Assignment:
        now = self._clock.now()
        attempt = self._db.mark_issued(mb.minibatch_id, gu_id, now)
        self._gus[gu_id].queued[mb.minibatch_id] = mb.predicted_load
        self.num_assigned[gu_id] += 1
        return Assignment(gu_id=gu_id, minibatch=mb, attempt=attempt, issued_at=now)
