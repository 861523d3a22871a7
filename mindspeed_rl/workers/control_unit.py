"""The Control Unit actor: the ``ControlLoop`` behind one threaded Ray actor.

::

    GU g ── poll(g, seen, wait_s) ─► ┌──────────── ControlUnit ────────────┐
         ◄─ GuPoll(assignments,      │ outbox[g] ◄── ControlLoop.dispatch() │
            snapshot, paused, news)  │ news[g]: bumped by a dispatch to g   │
    GU g ── request_start / ───────► │   and, for every GU, by a change of  │
            on_minibatch_completed   │   GuSignals (snapshot, pause, steps, │
    TU   ── on_snapshot_published ─► │   finished) or a failure             │
    driver ─ wait_global_batch ────► │ step_metrics(): per-step digest      │
                                     └──────────────────────────────────────┘

Delivery is pull-based: every dispatch lands in a per-GU outbox that the GU drains with
``poll``, together with the newest snapshot and the pause signal, in one round trip. The CU
therefore needs no GU handles, and a dead GU's undelivered assignments are simply discarded
(the ControlLoop re-queues them when the GU is declared failed).

``poll`` is a long-poll: it blocks until the GU's news counter moves past ``seen`` (or
``wait_s`` passes), so a GU waits for news instead of asking every few milliseconds. Every
method that can change what a GU may do calls ``_changed()``: it dispatches, compares the
``GuSignals`` with the last ones announced, bumps the counters and wakes the pollers. The driver
long-polls for its global batch (``wait_global_batch``) the same way. Polling instead costs CPU
that, on a small host, the rollout engines are using, and rounds every wait up to its period.

Departure from the paper: the Training Queue is not a separate actor. It lives here, inside
the ControlLoop, because backpressure and the lag gate read its depth synchronously at every
arrival and every pop; a separate actor would add one RPC per arrival and a window in which
the pause decision reads a stale depth. It is still its own class (``runtime.training_queue``).

The actor is threaded (GUs, the TU's writer thread and the driver call it concurrently), so
every method holds one lock, and the waits are Conditions on that lock (a waiting poll does not
hold it); the ControlLoop is built inside the actor because it holds a lock and cannot be pickled.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mindspeed_rl.runtime import events as ev
from mindspeed_rl.runtime.config import RuntimeConfig
from mindspeed_rl.runtime.controller import ControlLoop
from mindspeed_rl.runtime.records import (
    Assignment,
    CompletedMinibatch,
    GlobalBatch,
    ScheduledMinibatch,
    SnapshotInfo,
    StartDecision,
)
from mindspeed_rl.runtime.step_metrics import MetricsCursor, step_metrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class GuPoll:
    """What a GU learns from one ``poll``: new work, the snapshot to reload to, the pause signal."""

    assignments: tuple[Assignment, ...]
    latest_snapshot: SnapshotInfo | None
    paused: bool
    finished: bool
    """Every scheduled prompt has been consumed: the GU may stop."""
    gu_known: bool
    """False once the GU was declared failed (it must stop: its work went elsewhere)."""
    news: int
    """The GU's news counter at this answer: pass it as ``seen`` to wait for the next change."""
    answered_at: float
    """When the answer was taken (``time.time()``): every snapshot published by then is in it."""


class ControlUnit:
    def __init__(self, config: RuntimeConfig, schedule: Sequence[ScheduledMinibatch]) -> None:
        self._events = ev.EventLog()
        self._loop = ControlLoop(config=config, schedule=schedule, events=self._events)
        self._outbox: dict[int, list[Assignment]] = {}
        self._news: dict[int, int] = {}
        self._failed_gus: set[int] = set()
        self._cursor = MetricsCursor()
        self.snapshots_superseded = 0
        # Held around dispatch + outbox append so two threads cannot reorder one GU's assignments.
        self._lock = threading.RLock()
        # Signalled whenever a global batch may have become ready (completion, re-queue).
        self._batch_may_be_ready = threading.Condition(self._lock)
        # Signalled whenever some GU's news counter moved.
        self._news_moved = threading.Condition(self._lock)
        self._signals = self._loop.gu_signals()
        self._cpu_at_start = time.process_time()

    # ---- generation side ---------------------------------------------------------------------
    def register_gu(self, gu_id: int, num_actors: int) -> None:
        with self._lock:
            self._loop.register_gu(gu_id, num_actors=num_actors)
            self._outbox.setdefault(gu_id, [])
            self._news.setdefault(gu_id, 0)

    def start(self) -> int:
        """First dispatch, once every GU has registered; returns the number of assignments."""
        with self._lock:
            # The control plane's cost is what it burns while the pipeline runs: construction and
            # the wait for the engines to come up are start-up, like the engines' own start.
            self._cpu_at_start = time.process_time()
            return self._changed()

    def poll(self, gu_id: int, seen: int = -1, wait_s: float = 0.0) -> GuPoll:
        """What is new for ``gu_id``; blocks up to ``wait_s`` while its news counter is ``seen``."""
        if not wait_s >= 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}.")
        deadline = time.monotonic() + wait_s
        with self._news_moved:
            self._changed()
            while self._news.get(gu_id, seen) == seen and not self._loop.is_finished():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._news_moved.wait(remaining)
            known = gu_id not in self._failed_gus and gu_id in self._outbox
            work = tuple(self._outbox.get(gu_id, ())) if known else ()
            if known:
                self._outbox[gu_id] = []
            return GuPoll(
                assignments=work,
                latest_snapshot=self._loop.latest_snapshot(),
                paused=self._loop.pause_signal(),
                finished=self._loop.is_finished(),
                gu_known=known,
                news=self._news.get(gu_id, seen),
                answered_at=time.time(),
            )

    def request_start(
        self, minibatch_id: int, *, attempt: int, gu_id: int, actor_id: int, policy_version: int
    ) -> StartDecision:
        with self._lock:
            decision = self._loop.request_start(
                minibatch_id, attempt=attempt, gu_id=gu_id, actor_id=actor_id, policy_version=policy_version
            )
            if decision.granted:  # the GU's queue shrank: it may be refilled
                self._changed()
            return decision

    def on_minibatch_completed(self, completed: CompletedMinibatch) -> str:
        with self._lock:
            outcome = self._loop.on_minibatch_completed(completed)
            self._changed()
            self._batch_may_be_ready.notify_all()
            return outcome.value

    def on_actor_failed(self, gu_id: int, actor_id: int) -> list[int]:
        with self._lock:
            requeued = self._loop.on_actor_failed(gu_id, actor_id)
            if not self._loop.has_gu(gu_id):  # it was the GU's last actor
                self._forget_gu(gu_id)
            logger.warning("GU %d actor %d failed; re-queued minibatches %s", gu_id, actor_id, requeued)
            self._changed(everyone=True)  # released lag reservations may admit other GUs' starts
            self._batch_may_be_ready.notify_all()
            return requeued

    def on_gu_failed(self, gu_id: int) -> list[int]:
        with self._lock:
            if gu_id in self._failed_gus:
                return []
            requeued = self._loop.on_gu_failed(gu_id)
            self._forget_gu(gu_id)
            logger.warning("GU %d failed; re-queued minibatches %s", gu_id, requeued)
            self._changed(everyone=True)
            self._batch_may_be_ready.notify_all()
            return requeued

    def _forget_gu(self, gu_id: int) -> None:
        self._failed_gus.add(gu_id)
        self._outbox.pop(gu_id, None)

    def _changed(self, *, everyone: bool = False) -> int:
        """Dispatch and tell the GUs whose view moved; returns the number of new assignments.

        Called with the lock held after every update that can let some GU do something new."""
        assignments = self._loop.dispatch()
        moved = {a.gu_id for a in assignments}
        for a in assignments:
            assert a.gu_id in self._outbox, f"dispatched to unknown GU {a.gu_id}"
            self._outbox[a.gu_id].append(a)
        signals = self._loop.gu_signals()
        if everyone or signals != self._signals:
            self._signals = signals
            moved = set(self._news)
        for gu_id in moved:
            self._news[gu_id] += 1
        if moved:
            self._news_moved.notify_all()
        return len(assignments)

    # ---- weight flow ---------------------------------------------------------------------------
    def on_snapshot_published(self, snapshot: SnapshotInfo, save_seconds: float | None = None) -> bool:
        """Record a published snapshot; returns False if a newer one was announced first.

        The TU's writer thread announces snapshots in version order, but this actor is threaded
        and may run two announcements out of order; the older one is then superseded (actors
        always reload to the newest), so it is counted and logged instead of failing the run.
        """
        with self._lock:
            if snapshot.version <= self._loop.latest_version:
                self.snapshots_superseded += 1
                logger.info("snapshot v%d announced after a newer one; skipped", snapshot.version)
                return False
            self._loop.on_snapshot_published(snapshot, save_seconds=save_seconds)
            self._changed()
            return True

    def on_snapshot_converted(self, gu_id: int, version: int, seconds: float) -> None:
        with self._lock:
            self._loop.on_snapshot_converted(gu_id, version, seconds)

    def on_weights_loaded(
        self, gu_id: int, actor_id: int, version: int, seconds: float, started_at: float | None = None
    ) -> None:
        with self._lock:
            self._loop.on_weights_loaded(gu_id, actor_id, version, seconds, started_at=started_at)

    # ---- training side -------------------------------------------------------------------------
    def pop_global_batch(self, step: int) -> GlobalBatch | None:
        with self._lock:
            batch = self._loop.pop_global_batch(step)
            if batch is not None:
                self._changed()
            return batch

    def wait_global_batch(self, step: int, timeout_s: float) -> GlobalBatch | None:
        """``pop_global_batch``, blocking up to ``timeout_s`` for the batch to become ready.

        Returns ``None`` on timeout so the caller can check on the GUs (a dead GU's work is
        re-queued only once the driver declares it failed) and call again.
        """
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}.")
        deadline = time.monotonic() + timeout_s
        with self._batch_may_be_ready:
            while (batch := self._loop.pop_global_batch(step)) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._batch_may_be_ready.wait(remaining)
            self._changed()
            return batch

    def on_train_step_done(self, step: int) -> None:
        with self._lock:
            self._loop.on_train_step_done(step)
            self._changed()

    def step_metrics(self) -> dict[str, float]:
        """Observability digest since the previous call (one call per trainer step)."""
        with self._lock:
            seen = self._loop.observe(
                arrivals_since=self._cursor.num_arrivals, lag_steps_since=self._cursor.num_lag_steps
            )
            return step_metrics(seen, self._events, self._cursor)

    # ---- state -------------------------------------------------------------------------------
    def is_finished(self) -> bool:
        with self._lock:
            return self._loop.is_finished()

    def summary(self) -> dict[str, Any]:
        with self._lock:
            data = self._loop.summary().to_dict()
            data["snapshots_superseded"] = self.snapshots_superseded
            return data

    def cpu_seconds(self) -> float:
        """CPU time of this actor's process (all its threads, Ray's included) since ``start``."""
        return time.process_time() - self._cpu_at_start

    def check_invariants(self) -> None:
        with self._lock:
            self._loop.check_invariants()

    def event_records(self) -> list[dict[str, Any]]:
        """The whole control-plane event log as JSON-ready dicts (written to ``events.jsonl``)."""
        with self._lock:
            return [ev.EventLog.to_json_dict(e) for e in self._events]
