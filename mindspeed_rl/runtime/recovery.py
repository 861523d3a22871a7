"""What the ControlLoop does when a generation actor or a whole GU fails.

::

    actor raised / hung / died ──► actor_fault(kind, retire?) ─┬─ count the failed attempt (FaultLedger);
                                                               │  K failures of one minibatch = poison: ``fatal``
                                                               ├─ re-queue what it ran, to be re-issued first
                                                               └─ retire: actor_failed ─► GU out of actors? gu_failed
    GU died ──────────────────────► gu_failed ─► re-queue its queued and running minibatches

Re-queueing gives the started minibatches' lag reservations back and frees their GU queue
slots, so nothing is lost (the Database re-issues them) and nothing is counted twice. Part of
the ControlLoop (it holds the loop's lock when these run); kept apart because it is the one
concern the normal flow only reads: ``running_on`` (who runs what), ``retry_now`` and ``fatal``.
"""

from __future__ import annotations

from mindspeed_rl.runtime import events as ev
from mindspeed_rl.runtime.clock import Clock
from mindspeed_rl.runtime.database import Database
from mindspeed_rl.runtime.faults import FailedAttempt, FaultKind, FaultLedger, PipelineFailure
from mindspeed_rl.runtime.lag_budget import LagBudget
from mindspeed_rl.runtime.sender import Sender

# MinibatchRequeued.reason per fault (a death keeps the name it had before restarts existed).
_REQUEUE_REASON = {
    FaultKind.DIED: "actor_failed",
    FaultKind.ERROR: "actor_error",
    FaultKind.TIMEOUT: "actor_timeout",
}


class Recovery:
    def __init__(
        self,
        *,
        database: Database,
        sender: Sender,
        budget: LagBudget,
        faults: FaultLedger,
        events: ev.EventLog,
        clock: Clock,
    ) -> None:
        self._db, self._sender, self._budget = database, sender, budget
        self.faults, self._events, self._clock = faults, events, clock
        self.running_on: dict[tuple[int, int], int] = {}  # (gu, actor) -> minibatch id it runs
        self.retry_now: set[int] = set()  # failed attempts, re-issued ahead of the queue marks
        self.fatal: PipelineFailure | None = None
        """Set once the run cannot go on (a poison minibatch); nothing is dispatched after it."""
        self.actor_restarts = 0

    def actor_failed(self, gu_id: int, actor_id: int) -> list[int]:
        """An actor is gone for good; re-queue what it ran. A GU left without actors fails whole."""
        requeued = self._requeue(gu_id, actor_id, "actor_failed")
        if self._sender.gu(gu_id) is not None and self._sender.lose_actor(gu_id) == 0:
            requeued += self.gu_failed(gu_id, "gu_without_actors")
        return requeued

    def actor_fault(
        self, gu_id: int, actor_id: int, kind: FaultKind, detail: str, *, retire: bool
    ) -> list[int]:
        """An actor raised, hung past the timeout or died; its GU is replacing it (``retire``
        False) or gave up on it (its restarts are spent). Re-queues what it ran, counts the failed
        attempt, and sets ``fatal`` once that minibatch has failed ``minibatch_max_attempts`` times."""
        running = self.running_on.get((gu_id, actor_id))
        self._events.append(
            ev.ActorFaulted(
                time=self._clock.now(),
                gu_id=gu_id,
                actor_id=actor_id,
                kind=kind.value,
                detail=detail[:300],
                replaced=not retire,
            )
        )
        if kind is FaultKind.DIED:
            self.faults.by_kind[kind] += running is None  # a death between minibatches is counted too
        if running is not None:
            attempt = FailedAttempt(
                minibatch_id=running, gu_id=gu_id, actor_id=actor_id, kind=kind, detail=detail[:300]
            )
            poison = self.faults.record(attempt, self._db.minibatch(running).prompt_ids)
            if poison is not None and self.fatal is None:
                self.fatal = poison
            self.retry_now.add(running)
        if retire:
            return self.actor_failed(gu_id, actor_id)
        self.actor_restarts += 1
        return self._requeue(gu_id, actor_id, _REQUEUE_REASON[kind])

    def gu_failed(self, gu_id: int, reason: str) -> list[int]:
        """A GU died (or lost its last actor): re-queue its work and stop sending to it."""
        requeued = self._requeue(gu_id, None, reason)
        self._sender.remove_gu(gu_id)
        return requeued

    def _requeue(self, gu_id: int, actor_id: int | None, reason: str) -> list[int]:
        """Re-queue what ``actor_id`` of ``gu_id`` runs (None: everything issued to the GU)."""
        # The Database drops these records on re-queue without mutating them, so keeping refs is safe.
        victims = {
            mb_id: rec
            for mb_id, rec in self._db.in_flight_items()
            if rec.gu_id == gu_id and (actor_id is None or rec.actor_id == actor_id)
        }
        requeued = self._db.fail_gu(gu_id) if actor_id is None else self._db.fail_actor(gu_id, actor_id)
        assert set(victims) == set(requeued)
        now = self._clock.now()
        for mb_id in requeued:
            rec = victims[mb_id]
            if rec.actor_id is not None:  # it had started: give its lag reservation back
                assert rec.policy_version is not None
                self._budget.release(self._db.minibatch(mb_id).num_prompts, rec.policy_version)
                self.running_on.pop((rec.gu_id, rec.actor_id), None)
            self._sender.on_finished(mb_id, rec.gu_id)
            self._events.append(
                ev.MinibatchRequeued(
                    time=now, minibatch_id=mb_id, gu_id=rec.gu_id, actor_id=rec.actor_id, reason=reason
                )
            )
        return requeued
