"""The Control Unit actor: the ``ControlLoop`` behind one threaded Ray actor.

::

    GU g ── exchange(report, *completions) ──► ┌──────────── ControlUnit ─────────────┐
         ◄─ GuPoll(decision, assignments,       │ completions, reload and conversion   │
            snapshot, paused, seq)              │ reports, then the start request      │
    GU g ── poll(g, wait_s) (long-poll) ──────► │ outbox[g] ◄── ControlLoop.dispatch() │
         ◄─ GuPoll(assignments, snapshot, ...)  │ news[g] / urgent[g]: what g has not  │
    TU   ── on_snapshot_published ────────────► │   been told yet                      │
    driver ─ wait_global_batch ───────────────► │ step_metrics(): per-step digest      │
    driver ─ submit_eval / wait_eval ─────────► │ evaluations: EvalDesk (one GU each)  │
                                                └──────────────────────────────────────┘

One round trip per event on the GU side. ``exchange`` carries everything the GU has to report
(finished minibatches, finished reloads and conversions) and, when the GU's policy asks for one,
the start request for an idle actor; it answers with the start decision *and* everything new for
that GU (assignments, newest snapshot, pause signal). An actor finishing a minibatch and taking
the next one therefore costs one CU call, where reporting, asking and polling took three. Ray's
per-call machinery, not our logic, is what the control plane's CPU goes to (about 0.3 ms a call
on each side here; the method bodies are a few percent of it), so the count of calls is the lever.

Delivery is pull-based: every dispatch lands in a per-GU outbox that the GU drains with its next
``exchange`` or ``poll`` answer. The CU therefore needs no GU handles, and a dead GU's undelivered
assignments are simply discarded (the ControlLoop re-queues them when the GU is declared failed).
The outboxes and what each GU has been told live in ``workers/gu_mailbox.py``.

``poll`` is a long-poll: it blocks until there is news the GU would act on now, or ``wait_s``
passes (which news counts, and when, is ``gu_mailbox``'s bookkeeping). Polling instead would cost
CPU the rollout engines use on a small host, and round every wait up to its period.

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
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from mindspeed_rl.runtime.config import RuntimeConfig
from mindspeed_rl.runtime.controller import ControlLoop
from mindspeed_rl.runtime.faults import FaultKind
from mindspeed_rl.runtime.group_filter import DynamicSampling, GroupFilter
from mindspeed_rl.runtime.ingestor import IngestOutcome
from mindspeed_rl.runtime.records import (
    CompletedMinibatch,
    GlobalBatch,
    ScheduledMinibatch,
    SnapshotInfo,
    StartDecision,
)
from mindspeed_rl.runtime.replan import OnlineHook
from mindspeed_rl.workers.call_counts import counted
from mindspeed_rl.workers.cu_events import EventStream
from mindspeed_rl.workers.eval_desk import EvalDesk
from mindspeed_rl.workers.evaluator import EvalJob, HeldOutDecode
from mindspeed_rl.workers.gu_mailbox import GuMailboxes
from mindspeed_rl.workers.gu_messages import (
    GuFaultSettings,
    GuPoll,
    GuReport,
)
from mindspeed_rl.workers.prompt_book import PromptBook

logger = logging.getLogger(__name__)


class ControlUnit:
    def __init__(
        self,
        config: RuntimeConfig,
        schedule: Sequence[ScheduledMinibatch],
        events_path: str | None = None,
        *,
        group_filter: GroupFilter | None = None,
        steps_total: int | None = None,
        online: OnlineHook | None = None,
        streaming: bool = False,
    ) -> None:
        """``online``: online ASP's hook (``runtime.replan.OnlineHook``), fed below.
        ``streaming``: the schedule grows through ``extend_schedule`` (``asp_config.window``); the
        CU then carries the prompts' records to the actors and the trainer (``PromptBook``).
        ``events_path``: the run's ``events.jsonl``, appended to once per trainer step (and at
        ``close_events``), so the event log never crosses one giant RPC nor grows with the run.
        ``group_filter`` / ``steps_total``: DAPO's dynamic sampling (``runtime.group_filter``)."""
        self._config = config
        self._events = EventStream(events_path)
        self._loop = ControlLoop(
            config=config,
            schedule=schedule,
            events=self._events.log,
            sampling=None
            if group_filter is None or steps_total is None
            else DynamicSampling(
                group_filter, steps_total=steps_total, prompts_per_step=config.num_prompts_per_global_batch
            ),
            schedule_open=streaming,
        )
        self._book = PromptBook() if streaming else None
        self._mail = GuMailboxes()
        self.snapshots_superseded = 0
        self.calls: Counter[str] = Counter()
        # Held around dispatch + outbox append so two threads cannot reorder one GU's assignments.
        self._lock = threading.RLock()
        # Signalled whenever a global batch may have become ready (completion, re-queue).
        self._batch_may_be_ready = threading.Condition(self._lock)
        # Signalled whenever some GU's news counter moved or one of its actors went idle.
        self._news_moved = threading.Condition(self._lock)
        self._signals = self._loop.gu_signals()
        self._evals = EvalDesk(self._lock)
        self._cpu_at_start = time.process_time()
        self._online = online
        self._started = False

    # ---- generation side ---------------------------------------------------------------------
    def register_gu(self, gu_id: int, num_actors: int) -> GuFaultSettings:
        with self._lock:
            self._loop.register_gu(gu_id, num_actors=num_actors)
            self._mail.register(gu_id)
            c = self._config
            return GuFaultSettings(deadlines=c.deadline_settings(), actor_max_restarts=c.actor_max_restarts)

    def start(self) -> int:
        """First dispatch, once every GU has registered; returns the number of assignments."""
        with self._lock:
            # The control plane's cost is what it burns while the pipeline runs: construction and
            # the wait for the engines to come up are start-up, like the engines' own start.
            self._cpu_at_start = time.process_time()
            self._started = True
            if self._online is not None:  # the prompts' first possible dispatch
                self._online.on_scheduled(self._loop.database.schedule_now(), self._loop.clock.now())
            return self._changed()

    @counted
    def extend_schedule(self, more: Sequence[ScheduledMinibatch], records: Sequence[Any], close: bool) -> int:
        """A streaming window's next chunk and its prompts' records (``close``: the last chunk);
        returns the number of new assignments."""
        if self._book is None:
            raise ValueError("extend_schedule needs a ControlUnit started with streaming=True")
        with self._lock:
            self._book.add(records, more)
            added = self._loop.extend_schedule(more, close=close)
            if self._online is not None and self._started:  # else start() tells it
                self._online.on_scheduled(added, self._loop.clock.now())
                self._online.replan_now(self._loop.replan_unsent)  # before any GU can take it
            dispatched = self._changed(everyone=True)
            self._batch_may_be_ready.notify_all()  # closing may complete a short last batch
            return dispatched

    @counted
    def poll(self, gu_id: int, wait_s: float = 0.0) -> GuPoll:
        """What is new for ``gu_id``; blocks up to ``wait_s`` while nothing it would act on is new."""
        if not wait_s >= 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}.")
        deadline = time.monotonic() + wait_s
        with self._news_moved:
            self._changed()
            while not self._worth_answering(gu_id):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._news_moved.wait(remaining)
            return self._answer(gu_id)

    @counted
    def exchange(self, report: GuReport, *completions: CompletedMinibatch) -> GuPoll:
        """Take a GU's completions and reports, then its start request; answer with all its news.

        In the order the GU lived them: an actor's completion is ingested before the reload that
        followed it and before the start request that follows both."""
        g = report.gu_id
        with self._lock:
            for completed in completions:
                self._ingested(completed, self._loop.on_minibatch_completed(completed))
            for c in report.conversions:
                self._loop.on_snapshot_converted(g, c.version, c.seconds, at=c.finished_at, delta=c.delta)
            for r in report.reloads:
                self._loop.on_weights_loaded(g, r.actor_id, r.version, r.seconds, started_at=r.chosen_at)
            decision = None
            if (s := report.start) is not None:
                decision = self._loop.request_start(
                    s.minibatch_id,
                    attempt=s.attempt,
                    gu_id=g,
                    actor_id=s.actor_id,
                    policy_version=s.policy_version,
                )
            self._changed()
            if completions:
                self._batch_may_be_ready.notify_all()
            return self._answer(g, decision)

    @counted
    def request_start(
        self, minibatch_id: int, *, attempt: int, gu_id: int, actor_id: int, policy_version: int
    ) -> StartDecision:
        """One start request on its own (``exchange`` carries them in production)."""
        with self._lock:
            decision = self._loop.request_start(
                minibatch_id, attempt=attempt, gu_id=gu_id, actor_id=actor_id, policy_version=policy_version
            )
            if decision.granted:  # the GU's queue shrank: it may be refilled
                self._changed()
            return decision

    @counted
    def on_minibatch_completed(self, completed: CompletedMinibatch) -> str:
        """One completion on its own (``exchange`` carries them in production)."""
        with self._lock:
            outcome = self._loop.on_minibatch_completed(completed)
            self._ingested(completed, outcome)
            self._changed()
            self._news_moved.notify_all()  # an actor went idle: news it was not woken for now counts
            self._batch_may_be_ready.notify_all()
            return outcome.value

    @counted
    def on_actor_failed(self, gu_id: int, actor_id: int) -> list[int]:
        with self._lock:
            requeued = self._loop.on_actor_failed(gu_id, actor_id)
            logger.warning("GU %d actor %d failed; re-queued minibatches %s", gu_id, actor_id, requeued)
            return self._after_actor_loss(gu_id, requeued)

    @counted
    def on_actor_fault(self, gu_id: int, actor_id: int, kind: str, detail: str, retire: bool) -> list[int]:
        """An actor raised (``kind="error"``), hung (``"timeout"``) or died (``"died"``); its GU
        replaces it unless ``retire``. Its minibatch is re-issued, or the run fails if poison."""
        with self._lock:
            requeued = self._loop.on_actor_fault(gu_id, actor_id, FaultKind(kind), detail, retire=retire)
            logger.warning(
                "GU %d actor %d %s (%s); re-queued minibatches %s", gu_id, actor_id, kind, detail, requeued
            )
            return self._after_actor_loss(gu_id, requeued)

    def _after_actor_loss(self, gu_id: int, requeued: list[int]) -> list[int]:
        """After an actor is lost (lock held): a GU left without actors is gone, its evaluations
        go elsewhere; released lag reservations may admit other GUs' starts, and a poison
        minibatch fails the driver's wait."""
        if not self._loop.has_gu(gu_id):
            self._mail.forget(gu_id)
            self._reassign_evals(gu_id)
        self._changed(everyone=True)
        self._batch_may_be_ready.notify_all()
        return requeued

    @counted
    def on_gu_failed(self, gu_id: int) -> list[int]:
        with self._lock:
            if not self._mail.forget(gu_id):
                return []
            requeued = self._loop.on_gu_failed(gu_id)
            self._reassign_evals(gu_id)
            logger.warning("GU %d failed; re-queued minibatches %s", gu_id, requeued)
            self._changed(everyone=True)
            self._batch_may_be_ready.notify_all()
            return requeued

    @counted
    def on_gu_stopped(self, gu_id: int) -> None:
        """A GU's loop ended after the run was over: an evaluation it was given but never
        decoded goes to another GU (or fails by name), instead of waiting forever."""
        with self._lock:
            self._mail.forget(gu_id)
            self._reassign_evals(gu_id)

    def _worth_answering(self, gu_id: int) -> bool:
        """Whether a waiting poll of ``gu_id`` should return now (called with the lock held)."""
        if self._evals.has_mail(gu_id):
            return True
        return self._mail.worth_answering(
            gu_id,
            finished=self._gus_done(),
            has_idle_actor=lambda: self._loop.has_idle_actor(gu_id),
            paused=self._loop.pause_signal,
        )

    def _answer(self, gu_id: int, decision: StartDecision | None = None) -> GuPoll:
        """Hand ``gu_id`` its outbox and the signals (lock held)."""
        paused = self._loop.pause_signal()
        delivery = self._mail.take(gu_id, paused=paused)
        return GuPoll(
            assignments=delivery.assignments,
            latest_snapshot=self._loop.latest_snapshot(),
            paused=paused,
            finished=self._gus_done(),
            gu_known=delivery.known,
            seq=delivery.seq,
            answered_at=time.time(),
            decision=decision,
            eval_jobs=self._evals.take(gu_id) if delivery.known else (),
        )

    def _gus_done(self) -> bool:
        """The GUs may stop: every prompt consumed and no evaluation waiting for a decode."""
        return self._loop.is_finished() and not self._evals.pending

    def _live_gus(self) -> list[int]:
        return [g for g in self._mail.every_gu() if not self._mail.is_forgotten(g) and self._loop.has_gu(g)]

    def _reassign_evals(self, gu_id: int) -> None:
        """A failed GU's evaluations go to a live one (lock held)."""
        self._tell_urgent(self._evals.reassign(gu_id, self._live_gus()))

    def _tell_urgent(self, gu_ids: Iterable[int]) -> None:
        """News ``gu_ids`` must hear even while paused or busy (lock held)."""
        if told := set(gu_ids):
            self._mail.tell(told, urgent=True)
            self._news_moved.notify_all()

    # ---- evaluations ---------------------------------------------------------------------------
    @counted
    def submit_eval(self, job: EvalJob) -> int | None:
        """Hand an evaluation to one GU (the lowest live one); returns it, None if none is left."""
        with self._lock:
            gu_id = self._evals.submit(job, self._live_gus())
            self._tell_urgent([] if gu_id is None else [gu_id])
            return gu_id

    @counted
    def on_eval_done(self, gu_id: int, job_id: int, decoded: HeldOutDecode | None, error: str | None) -> None:
        """A GU's result for an evaluation: the decode, or why none could be made."""
        with self._lock:
            if not self._evals.done(job_id, decoded, error):
                return
            self._loop.note_progress()  # the trainer waited on it, not on a stalled pipeline
            if error is not None:
                logger.error("GU %d could not decode evaluation %d: %s", gu_id, job_id, error)
            if self._gus_done():  # the last evaluation of a finished run: the GUs may stop now
                self._tell_urgent(self._mail.every_gu())

    @counted
    def wait_eval(self, job_id: int, timeout_s: float) -> HeldOutDecode | None:
        """An evaluation's decode, blocking up to ``timeout_s`` (None on timeout); raises the GU's
        reason when it could not decode, and the run's failure if it cannot go on."""
        return self._evals.wait(job_id, timeout_s, fatal=lambda: self._loop.fatal)

    def _changed(self, *, everyone: bool = False) -> int:
        """Dispatch and tell the GUs whose view moved; returns the number of new assignments.

        Called with the lock held after every update that can let some GU do something new."""
        assignments = self._loop.dispatch()
        moved = {a.gu_id for a in assignments}
        for a in assignments:
            self._mail.post(a if self._book is None else self._book.attach(a))
        signals, before = self._loop.gu_signals(), self._signals
        urgent = False
        if everyone or signals != before:
            self._signals = signals
            moved = self._mail.every_gu()
            new_snapshot = signals.latest_version != before.latest_version
            urgent = everyone or new_snapshot or signals.finished != before.finished
        self._mail.tell(moved, urgent=urgent)
        if moved:
            self._news_moved.notify_all()
        return len(assignments)

    # ---- weight flow ---------------------------------------------------------------------------
    @counted
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

    @counted
    def on_weights_loaded(
        self, gu_id: int, actor_id: int, version: int, seconds: float, started_at: float | None = None
    ) -> None:
        with self._lock:
            self._loop.on_weights_loaded(gu_id, actor_id, version, seconds, started_at=started_at)

    # ---- training side -------------------------------------------------------------------------
    @counted
    def pop_global_batch(self, step: int) -> GlobalBatch | None:
        with self._lock:
            batch = self._loop.pop_global_batch(step)
            if batch is not None:
                self._changed()
            return self._with_records(batch)

    @counted
    def wait_global_batch(self, step: int, timeout_s: float) -> GlobalBatch | None:
        """``pop_global_batch``, blocking up to ``timeout_s`` for the batch to become ready.

        Returns ``None`` on timeout; raises ``PipelineFailure`` (a poison minibatch, no GU left,
        no progress for ``stall_timeout_s``) as soon as the run cannot go on. The stall check
        wakes only at the stall deadline: no periodic polling.
        """
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}.")
        deadline = time.monotonic() + timeout_s
        with self._batch_may_be_ready:
            while (batch := self._loop.pop_global_batch(step)) is None:
                if (failure := self._loop.failure()) is not None:
                    raise failure
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._batch_may_be_ready.wait(min(remaining, self._until_stall()))
            if self._online is not None:
                self._online.on_consumed(batch, self._loop.clock.now())
            self._changed()
            return self._with_records(batch)

    def _with_records(self, batch: GlobalBatch | None) -> GlobalBatch | None:
        return batch if batch is None or self._book is None else self._book.take(batch)

    @counted
    def on_train_step_done(self, step: int) -> dict[str, float]:
        """Record the trained step and return the pipeline digest since the previous step (one
        round trip per step: the driver needs both)."""
        with self._lock:
            self._loop.on_train_step_done(step)
            self._changed()
            digest = self._digest()
            if self._online is not None:
                digest.update(self._online.after_step(step, self._loop.replan_unsent))
            self._events.flush(self._loop)
            return digest

    @counted
    def schedule_now(self) -> tuple[ScheduledMinibatch, ...]:
        """The schedule as it stands (online ASP re-plans it), for the next checkpoint."""
        with self._lock:
            return self._loop.database.schedule_now()

    def _ingested(self, completed: CompletedMinibatch, outcome: IngestOutcome) -> None:
        if self._online is not None and outcome is IngestOutcome.ACCEPTED:
            self._online.observe(completed)

    def _until_stall(self) -> float:
        """Seconds until the stall deadline (lock held); a little past it, so it has expired."""
        stall = self._config.stall_timeout_s
        if stall is None:
            return float("inf")
        idle = self._loop.clock.now() - self._loop.last_progress
        return max(0.05, stall - idle + 0.05)

    def close_events(self) -> int:
        """Write the events not written yet and close events.jsonl; returns the events logged."""
        with self._lock:
            return self._events.close()

    @counted
    def step_metrics(self) -> dict[str, float]:
        """Observability digest since the previous digest."""
        with self._lock:
            return self._digest()

    def _digest(self) -> dict[str, float]:
        return self._events.digest(self._loop)

    # ---- state -------------------------------------------------------------------------------
    def is_finished(self) -> bool:
        with self._lock:
            return self._loop.is_finished()

    def summary(self) -> dict[str, Any]:
        with self._lock:
            data = self._loop.summary().to_dict()
            data["snapshots_superseded"] = self.snapshots_superseded
            data["cu_calls"] = dict(sorted(self.calls.items()))
            if self._online is not None:
                data.update(self._online.summary())
            if self._loop.sampling is not None:
                data.update(self._loop.sampling.summary())
            return data

    def cpu_seconds(self) -> float:
        """CPU time of this actor's process (all its threads, Ray's included) since ``start``."""
        return time.process_time() - self._cpu_at_start

    def check_invariants(self) -> None:
        with self._lock:
            self._loop.check_invariants()

    def event_records(self) -> list[dict[str, Any]]:
        """The events still held as JSON-ready dicts (all of them unless streamed to a file)."""
        with self._lock:
            return self._events.records()
