"""The Database: where every scheduled minibatch is in its life, and the order to send them in.

Each minibatch is in exactly one state::

    PENDING ──issue──► ISSUED ──start──► RUNNING ──complete──► COMPLETED
       ▲                 │                  │
       └─── REQUEUED ◄───┴──── GU/actor failure

Re-queued minibatches are sent again before any new work, in schedule order, so a failure does
not push its prompts behind the rest of the run. The schedule is never re-optimized here; an
online re-plan (``runtime/replan.py``) may swap the unsent tail for another ordering of its prompts.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mindspeed_rl.runtime.records import ScheduledMinibatch


class MinibatchState(enum.Enum):
    HELD = "held"
    """Over-sampling reserve (``ScheduledMinibatch.reserve``): not sent until released."""
    PENDING = "pending"
    REQUEUED = "requeued"
    ISSUED = "issued"
    RUNNING = "running"
    COMPLETED = "completed"


@dataclass(slots=True, kw_only=True)
class InFlight:
    """An issued minibatch: which GU holds it, and which actor runs it once started."""

    gu_id: int
    attempt: int
    issued_at: float
    actor_id: int | None = None
    started_at: float | None = None
    policy_version: int | None = None


class Database:
    def __init__(self, schedule: Sequence[ScheduledMinibatch]) -> None:
        ordered = sorted(schedule, key=lambda mb: mb.order_index)
        _validate_schedule(ordered)
        self._minibatches = {mb.minibatch_id: mb for mb in ordered}
        self._state = {
            mb.minibatch_id: MinibatchState.HELD if mb.reserve else MinibatchState.PENDING for mb in ordered
        }
        self._pending: deque[int] = deque(mb.minibatch_id for mb in ordered if not mb.reserve)
        # DAPO's over-sampling reserve, released a batch group at a time (``release_held``).
        self._held: deque[int] = deque(mb.minibatch_id for mb in ordered if mb.reserve)
        self._requeued: list[tuple[int, int]] = []  # heap of (order_index, minibatch_id)
        self._in_flight: dict[int, InFlight] = {}
        self._num_attempts: dict[int, int] = {}
        self._num_completed = 0
        self.num_requeued = 0
        self.num_reissued = 0

    # ---- queries -------------------------------------------------------------------------
    def minibatch(self, minibatch_id: int) -> ScheduledMinibatch:
        return self._minibatches[minibatch_id]

    def state(self, minibatch_id: int) -> MinibatchState:
        if minibatch_id not in self._state:
            raise ValueError(f"unknown minibatch id {minibatch_id}; it is not in the schedule.")
        return self._state[minibatch_id]

    def in_flight(self, minibatch_id: int) -> InFlight | None:
        return self._in_flight.get(minibatch_id)

    def minibatch_ids(self) -> list[int]:
        return list(self._minibatches)

    def in_flight_items(self) -> list[tuple[int, InFlight]]:
        return list(self._in_flight.items())

    @property
    def num_minibatches(self) -> int:
        return len(self._minibatches)

    @property
    def num_prompts(self) -> int:
        return sum(mb.num_prompts for mb in self._minibatches.values())

    @property
    def max_minibatch_prompts(self) -> int:
        return max((mb.num_prompts for mb in self._minibatches.values()), default=0)

    @property
    def num_completed(self) -> int:
        return self._num_completed

    def has_unsent(self) -> bool:
        return bool(self._pending or self._requeued)

    def num_live_prompts(self) -> int:
        """Prompts sent or sendable and not yet completed (pending, re-queued, issued, running)."""
        done = (MinibatchState.COMPLETED, MinibatchState.HELD)
        return sum(mb.num_prompts for i, mb in self._minibatches.items() if self._state[i] not in done)

    @property
    def num_held_prompts(self) -> int:
        return sum(self._minibatches[i].num_prompts for i in self._held)

    def release_held(self) -> tuple[ScheduledMinibatch, ...]:
        """Move the next held batch group to the end of the send order; () when none is held."""
        if not self._held:
            return ()
        group = self._minibatches[self._held[0]].batch_group_id
        released = []
        while self._held and self._minibatches[self._held[0]].batch_group_id == group:
            mb_id = self._held.popleft()
            self._state[mb_id] = MinibatchState.PENDING
            self._pending.append(mb_id)
            released.append(self._minibatches[mb_id])
        return tuple(released)

    def all_completed(self) -> bool:
        return self._num_completed == len(self._minibatches)

    def next_to_send(self, *, whole_group: bool = True) -> tuple[ScheduledMinibatch, ...]:
        """The next dispatch unit, without removing it.

        Re-queued minibatches come first, all of them together in schedule order. Otherwise the
        rest of the next batch group (``whole_group``) or just the next minibatch.
        """
        if self._requeued:
            return tuple(self._minibatches[i] for _, i in sorted(self._requeued))
        if not self._pending:
            return ()
        head = self._minibatches[self._pending[0]]
        if not whole_group:
            return (head,)
        unit = []
        for mb_id in self._pending:
            mb = self._minibatches[mb_id]
            if mb.batch_group_id != head.batch_group_id:
                break
            unit.append(mb)
        return tuple(unit)

    # ---- transitions ---------------------------------------------------------------------
    def mark_issued(self, minibatch_id: int, gu_id: int, now: float) -> int:
        """Issue the next minibatch in send order to ``gu_id``; returns the attempt number."""
        state = self.state(minibatch_id)
        if state is MinibatchState.REQUEUED:
            head = self._requeued[0][1]
            assert head == minibatch_id, f"re-issue out of order: {minibatch_id} before {head}"
            heapq.heappop(self._requeued)
            self.num_reissued += 1
        elif state is MinibatchState.PENDING:
            head = self._pending[0]
            assert head == minibatch_id, f"issue out of schedule order: {minibatch_id} before {head}"
            self._pending.popleft()
        else:
            raise AssertionError(f"minibatch {minibatch_id} issued while {state.value}")
        attempt = self._num_attempts.get(minibatch_id, 0)
        self._num_attempts[minibatch_id] = attempt + 1
        self._in_flight[minibatch_id] = InFlight(gu_id=gu_id, attempt=attempt, issued_at=now)
        self._state[minibatch_id] = MinibatchState.ISSUED
        return attempt

    def mark_started(self, minibatch_id: int, actor_id: int, policy_version: int, now: float) -> None:
        assert self.state(minibatch_id) is MinibatchState.ISSUED, f"start of {minibatch_id} not issued"
        record = self._in_flight[minibatch_id]
        record.actor_id, record.started_at, record.policy_version = actor_id, now, policy_version
        self._state[minibatch_id] = MinibatchState.RUNNING

    def mark_completed(self, minibatch_id: int) -> InFlight:
        assert self.state(minibatch_id) is MinibatchState.RUNNING, f"completion of {minibatch_id} not running"
        self._state[minibatch_id] = MinibatchState.COMPLETED
        self._num_completed += 1
        return self._in_flight.pop(minibatch_id)

    def fail_gu(self, gu_id: int) -> list[int]:
        """Re-queue everything issued to ``gu_id`` (queued there or running); returns the ids."""
        return self._requeue(lambda rec: rec.gu_id == gu_id)

    def fail_actor(self, gu_id: int, actor_id: int) -> list[int]:
        """Re-queue the minibatch(es) running on one actor; ones still queued at its GU stay there."""
        return self._requeue(lambda rec: rec.gu_id == gu_id and rec.actor_id == actor_id)

    def _requeue(self, match: Callable[[InFlight], bool]) -> list[int]:
        victims = sorted(
            (mb_id for mb_id, rec in self._in_flight.items() if match(rec)),
            key=lambda i: self._minibatches[i].order_index,
        )
        for mb_id in victims:
            del self._in_flight[mb_id]
            self._state[mb_id] = MinibatchState.REQUEUED
            heapq.heappush(self._requeued, (self._minibatches[mb_id].order_index, mb_id))
        self.num_requeued += len(victims)
        return victims

    # ---- online re-plan (runtime/replan.py) ----------------------------------------------
    def unsent_tail(self) -> tuple[ScheduledMinibatch, ...]:
        """The pending minibatches a re-plan may rebuild, in send order.

        Everything issued, running, completed or re-queued is excluded, and so is the rest of a
        batch group some of whose minibatches were already issued (a group is balanced as a
        whole, so a half-sent one is finished as planned)."""
        pending = [self._minibatches[i] for i in self._pending]
        started_groups = {
            self._minibatches[i].batch_group_id
            for i, state in self._state.items()
            if state is not MinibatchState.PENDING
        }
        return tuple(mb for mb in pending if mb.batch_group_id not in started_groups)

    def schedule_now(self) -> tuple[ScheduledMinibatch, ...]:
        """Every minibatch of the schedule as it stands (re-planned tails included), in dispatch
        order: what a checkpoint carries so a resumed run continues the re-planned order."""
        return tuple(sorted(self._minibatches.values(), key=lambda mb: mb.order_index))

    def replace_unsent_tail(self, new: Sequence[ScheduledMinibatch]) -> int:
        """Replace :meth:`unsent_tail` by ``new`` (the re-planned tail); returns how many left.

        ``new`` must hold exactly the tail's prompts (each once), with minibatch ids, batch
        group ids and order indices unused by the rest of the schedule, order indices after
        every kept minibatch's, and contiguous groups, so every invariant of ``__init__`` and
        exactly-once hold after the swap."""
        tail = self.unsent_tail()
        old_ids = {mb.minibatch_id for mb in tail}
        kept = [mb for i, mb in self._minibatches.items() if i not in old_ids]
        old_prompts = sorted(p for mb in tail for p in mb.prompt_ids)
        new_prompts = sorted(p for mb in new for p in mb.prompt_ids)
        if old_prompts != new_prompts:
            raise ValueError(
                f"a re-planned tail must hold exactly the {len(old_prompts)} prompts of the unsent tail "
                f"(each once), got {len(new_prompts)}; re-plan from unsent_tail()."
            )
        kept_ids = {mb.minibatch_id for mb in kept}
        kept_groups = {mb.batch_group_id for mb in kept}
        last_kept = max((mb.order_index for mb in kept), default=-1)
        for mb in new:
            if mb.minibatch_id in kept_ids or mb.batch_group_id in kept_groups or mb.order_index <= last_kept:
                raise ValueError(
                    f"re-planned minibatch {mb.minibatch_id} reuses an id or group of the kept schedule, "
                    f"or is ordered before it (order_index {mb.order_index} <= {last_kept}); number the new "
                    "tail after the whole schedule."
                )
        ordered_new = sorted(new, key=lambda mb: mb.order_index)
        _validate_schedule(ordered_new)
        for mb_id in old_ids:
            del self._minibatches[mb_id], self._state[mb_id]
        self._pending = deque(i for i in self._pending if i not in old_ids)
        for mb in ordered_new:
            self._minibatches[mb.minibatch_id] = mb
            self._state[mb.minibatch_id] = MinibatchState.PENDING
            self._pending.append(mb.minibatch_id)
        return len(ordered_new)

    def extend(self, more: Sequence[ScheduledMinibatch]) -> tuple[ScheduledMinibatch, ...]:
        """Append ``more`` after the whole schedule (a streaming window's next chunk); returns it
        as appended.

        The chunk keeps its own order and grouping but is renumbered (ids, batch groups, order
        indices) after the schedule as it stands: only the database knows that numbering, since
        an online re-plan renumbers the unsent tail after everything it has seen. Its prompts must
        be new, so exactly-once holds over the grown schedule."""
        if any(mb.reserve for mb in more):
            raise ValueError("an appended chunk cannot hold over-sampling reserve minibatches")
        known = sorted(self._minibatches.values(), key=lambda mb: mb.order_index)
        ordered = renumbered(
            more,
            first_id=max((mb.minibatch_id for mb in known), default=-1) + 1,
            first_group=max((mb.batch_group_id for mb in known), default=-1) + 1,
            first_order=max((mb.order_index for mb in known), default=-1) + 1,
        )
        _validate_schedule(known + list(ordered))  # prompts unique over the grown schedule
        for mb in ordered:
            self._minibatches[mb.minibatch_id] = mb
            self._state[mb.minibatch_id] = MinibatchState.PENDING
            self._pending.append(mb.minibatch_id)
        return ordered

    # ---- invariants ----------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Every minibatch is in exactly one state and in exactly the matching structure."""
        pending, requeued = set(self._pending), {i for _, i in self._requeued}
        in_flight, held = set(self._in_flight), set(self._held)
        assert not held & (pending | requeued | in_flight), "a held minibatch is also in flight or queued"
        assert len(pending) == len(self._pending), "a minibatch is pending twice"
        assert len(requeued) == len(self._requeued), "a minibatch is re-queued twice"
        assert not (pending & requeued or pending & in_flight or requeued & in_flight)
        num_completed = 0
        for mb_id, state in self._state.items():
            expected = {
                MinibatchState.HELD: mb_id in held,
                MinibatchState.PENDING: mb_id in pending,
                MinibatchState.REQUEUED: mb_id in requeued,
                MinibatchState.ISSUED: mb_id in in_flight and self._in_flight[mb_id].actor_id is None,
                MinibatchState.RUNNING: mb_id in in_flight and self._in_flight[mb_id].actor_id is not None,
                MinibatchState.COMPLETED: mb_id not in pending | requeued | in_flight | held,
            }[state]
            assert expected, f"minibatch {mb_id} is {state.value} but its bookkeeping disagrees"
            num_completed += state is MinibatchState.COMPLETED
        assert num_completed == self._num_completed


def _validate_schedule(ordered: list[ScheduledMinibatch]) -> None:
    ids = [mb.minibatch_id for mb in ordered]
    if len(set(ids)) != len(ids):
        raise ValueError("the schedule repeats a minibatch_id; rebuild it so ids are unique.")
    if len({mb.order_index for mb in ordered}) != len(ordered):
        raise ValueError("the schedule repeats an order_index; each minibatch needs its own position.")
    seen_prompts: set[str] = set()
    for mb in ordered:
        clash = seen_prompts.intersection(mb.prompt_ids)
        if clash:
            raise ValueError(
                f"prompt(s) {sorted(clash)[:3]} appear in more than one minibatch; each prompt must be "
                "scheduled exactly once (its n samples are generated together)."
            )
        seen_prompts.update(mb.prompt_ids)
    finished_groups: set[int] = set()
    for prev, mb in zip(ordered, ordered[1:]):
        if mb.batch_group_id != prev.batch_group_id:
            finished_groups.add(prev.batch_group_id)
            if mb.batch_group_id in finished_groups:
                raise ValueError(
                    f"batch group {mb.batch_group_id} is not contiguous in the dispatch order; "
                    "shuffle whole groups only, never split one."
                )


def renumbered(
    chunk: Sequence[ScheduledMinibatch], *, first_id: int, first_group: int, first_order: int
) -> tuple[ScheduledMinibatch, ...]:
    """``chunk`` in its own order, numbered consecutively from the given id, group and position
    (its batch groups stay apart from each other and from everything numbered before)."""
    groups: dict[int, int] = {}
    out = []
    for i, mb in enumerate(sorted(chunk, key=lambda m: m.order_index)):
        group = groups.setdefault(mb.batch_group_id, first_group + len(groups))
        out.append(
            dataclasses.replace(
                mb, minibatch_id=first_id + i, batch_group_id=group, order_index=first_order + i
            )
        )
    return tuple(out)
