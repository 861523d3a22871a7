"""The ControlLoop: the Control Unit's logic as one pure-Python object.

::

      ASP schedule
           │
     ┌─────▼─────┐  dispatch(): whole batch groups,  ┌──────────── GU g ─────────────┐
     │ Database  ├─► least-loaded GU, low/high marks ─► input queue ─► request_start()│
     │ (states,  │                                    │   granted? ── no: pause_signal│
     │  re-queue)│◄── on_gu_failed / on_actor_failed ─┤   (backpressure) or lag budget│
     └─────▲─────┘                                    │   yes: actor generates        │
           │ mark_completed                           └──────────────┬────────────────┘
     ┌─────┴─────┐   on_minibatch_completed()                        │
     │ Ingestor  │◄──────────────────────────────────────────────────┘
     │ dup/stale │
     └─────┬─────┘ put (with lag deadline)        depth ──► Backpressure (hysteresis)
     ┌─────▼─────────┐  pop_global_batch(step): EDF, whole prompts, lag-gated
     │ TrainingQueue ├──────────────────────────────────► TU trains step s
     └───────────────┘                                       │
           ▲   on_train_step_done(s, snapshot v=s+1) ◄───────┘
           └── LagTracker (d_off = s - version; Eq. 4 alongside); GUs reload between minibatches

Adapters drive it: the Ray ControlUnit actor forwards GU/TU messages to these methods and sends
what ``dispatch()`` returns; the simulator calls them with modeled times through a ``FakeClock``.
Every public method holds one re-entrant lock, so a threaded Ray actor cannot interleave two
updates; the parts inside are deliberately lock-free because they are only reached from here.
The read-outs that gather from every part (``observe``, the stall view) live in ``readout.py``.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Concatenate, ParamSpec, TypeVar

from mindspeed_rl.runtime import events as ev
from mindspeed_rl.runtime import readout, replan
from mindspeed_rl.runtime.backpressure import Backpressure
from mindspeed_rl.runtime.clock import Clock, WallClock
from mindspeed_rl.runtime.config import RuntimeConfig
from mindspeed_rl.runtime.database import Database, MinibatchState
from mindspeed_rl.runtime.errors import ProtocolError
from mindspeed_rl.runtime.faults import (
    FaultKind,
    FaultLedger,
    PipelineFailure,
    StalledPipeline,
    diagnose_stall,
)
from mindspeed_rl.runtime.group_filter import DynamicSampling
from mindspeed_rl.runtime.ingestor import Ingestor, IngestOutcome
from mindspeed_rl.runtime.lag import LagTracker
from mindspeed_rl.runtime.lag_budget import LagBudget
from mindspeed_rl.runtime.observation import LoopObservation
from mindspeed_rl.runtime.records import (
    Assignment,
    CompletedMinibatch,
    GlobalBatch,
    GuSignals,
    ScheduledMinibatch,
    SnapshotInfo,
    StartDecision,
    StartRefusal,
)
from mindspeed_rl.runtime.recovery import Recovery
from mindspeed_rl.runtime.sender import Sender
from mindspeed_rl.runtime.summary import RuntimeSummary, build_summary
from mindspeed_rl.runtime.timings import ActorActivityLog, TimingStats, eq4_d_off_estimate
from mindspeed_rl.runtime.training_queue import TrainingQueue
from mindspeed_rl.runtime.weight_flow import WeightFlowLedger

P = ParamSpec("P")
R = TypeVar("R")


def _serialized(method: Callable[Concatenate[ControlLoop, P], R]) -> Callable[Concatenate[ControlLoop, P], R]:
    @functools.wraps(method)
    def wrapper(self: ControlLoop, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class ControlLoop:
    def __init__(
        self,
        *,
        config: RuntimeConfig,
        schedule: Sequence[ScheduledMinibatch],
        clock: Clock | None = None,
        events: ev.EventLog | None = None,
        sampling: DynamicSampling | None = None,
        schedule_open: bool = False,
    ) -> None:
        """``sampling``: DAPO's dynamic sampling (``runtime/group_filter.py``), None when off;
        ``schedule_open``: more chunks come through ``extend_schedule`` (``asp_config.window``)."""
        self.config = config
        self.sampling = sampling
        self.clock: Clock = clock or WallClock()
        self.events = events if events is not None else ev.EventLog()
        self.database = Database(schedule)
        config.check_minibatch_fits(self.database.max_minibatch_prompts)
        self.queue = TrainingQueue(
            num_prompts_per_global_batch=config.num_prompts_per_global_batch, clock=self.clock
        )
        self.sender = Sender(
            queue_low=config.gu_queue_low,
            queue_high=config.gu_queue_high,
            database=self.database,
            clock=self.clock,
        )
        self.ingestor = Ingestor(
            database=self.database,
            queue=self.queue,
            num_samples_per_prompt=config.num_samples_per_prompt,
            clock=self.clock,
            group_filter=None if sampling is None else sampling.filter,
        )
        self.backpressure = Backpressure(
            max_samples=config.queue_max_samples, resume_samples=config.queue_resume_samples, clock=self.clock
        )
        self.budget = LagBudget(
            max_policy_lag=config.max_policy_lag, prompts_per_step=config.num_prompts_per_global_batch
        )
        self.lag = LagTracker()
        self.timings = TimingStats()
        self.activity = ActorActivityLog()
        self.starts_refused: Counter[str] = Counter()
        self.trainer_lag_holds = 0
        self.weights = WeightFlowLedger(
            timings=self.timings, activity=self.activity, events=self.events, clock=self.clock
        )
        self.prompts_consumed = 0
        self.faults = FaultLedger(max_attempts=config.minibatch_max_attempts)
        self.recovery = Recovery(
            database=self.database,
            sender=self.sender,
            budget=self.budget,
            faults=self.faults,
            events=self.events,
            clock=self.clock,
        )
        self.last_progress = self.clock.now()
        self.last_refusal: dict[int, str] = {}
        """GU -> the reason its latest start was refused, while it has not started since."""
        self._actors_registered: dict[int, int] = {}
        self._step_in_progress: tuple[int, float] | None = None  # (step, popped at)
        self.schedule_open = schedule_open
        self._lock = threading.RLock()

    # ---- generation side ---------------------------------------------------------------------
    @_serialized
    def register_gu(self, gu_id: int, *, num_actors: int) -> None:
        """Make a GU known without dispatching yet (register all GUs, then ``dispatch()``, so the
        first batch groups spread over every GU instead of filling whichever came up first)."""
        self.sender.register_gu(gu_id, num_actors)
        self._actors_registered[gu_id] = max(num_actors, self._actors_registered.get(gu_id, 0))

    @_serialized
    def has_gu(self, gu_id: int) -> bool:
        """Whether ``gu_id`` still receives work (False once failed or out of actors)."""
        return self.sender.gu(gu_id) is not None

    @_serialized
    def on_gu_capacity(self, gu_id: int, *, num_actors: int) -> list[Assignment]:
        """A GU (re)joined or its actor count changed; returns new work for all GUs."""
        self.sender.register_gu(gu_id, num_actors)
        return self._dispatch()

    @_serialized
    def dispatch(self) -> list[Assignment]:
        """Refill GU input queues that need it; call after any event that frees queue space."""
        return self._dispatch()

    def _dispatch(self) -> list[Assignment]:
        if self.fatal is not None:
            return []
        if self.sampling is not None:
            self.sampling.release_reserve(self.database, self.budget.next_step, self.queue.depth_prompts)
        retry_now = self.recovery.retry_now
        assignments = self.sender.dispatch(urgent=retry_now)
        retry_now.difference_update(a.minibatch.minibatch_id for a in assignments)
        for a in assignments:
            self.events.append(
                ev.MinibatchIssued(
                    time=a.issued_at,
                    minibatch_id=a.minibatch.minibatch_id,
                    gu_id=a.gu_id,
                    attempt=a.attempt,
                    batch_group_id=a.minibatch.batch_group_id,
                )
            )
        return assignments

    @_serialized
    def pause_signal(self) -> bool:
        """True while backpressure forbids starting minibatches (GUs poll this cheaply)."""
        return self.backpressure.paused

    @_serialized
    def gu_signals(self) -> GuSignals:
        """What a waiting GU needs to notice a change in (cheap: adapters compare it per call)."""
        return GuSignals(
            latest_version=self.latest_version,
            paused=self.backpressure.paused,
            finished=not self.schedule_open and self.prompts_consumed == self.database.num_prompts,
            train_steps=self.budget.next_step,
        )

    @_serialized
    def has_idle_actor(self, gu_id: int) -> bool:
        """Whether some live actor of ``gu_id`` runs no granted minibatch (it may be waiting to start)."""
        gu = self.sender.gu(gu_id)
        return gu is not None and len(gu.running) < gu.num_actors

    @_serialized
    def request_start(
        self, minibatch_id: int, *, attempt: int, gu_id: int, actor_id: int, policy_version: int
    ) -> StartDecision:
        """Ask to start a queued minibatch on an idle actor; a grant records the start."""
        refusal = self._start_refusal(minibatch_id, attempt, gu_id, actor_id, policy_version)
        if refusal is not None:
            self.starts_refused[refusal.value] += 1
            if refusal is not StartRefusal.REVOKED:
                self.last_refusal[gu_id] = refusal.value
            return StartDecision(granted=False, refusal=refusal)
        mb = self.database.minibatch(minibatch_id)
        now = self.clock.now()
        self.database.mark_started(minibatch_id, actor_id, policy_version, now)
        self.sender.on_started(minibatch_id, gu_id)
        self.budget.reserve(mb.num_prompts, policy_version)
        self.recovery.running_on[(gu_id, actor_id)] = minibatch_id
        self.last_refusal.pop(gu_id, None)
        self.events.append(
            ev.MinibatchStarted(
                time=now,
                minibatch_id=minibatch_id,
                gu_id=gu_id,
                actor_id=actor_id,
                policy_version=policy_version,
            )
        )
        return StartDecision(granted=True)

    def _start_refusal(
        self, minibatch_id: int, attempt: int, gu_id: int, actor_id: int, policy_version: int
    ) -> StartRefusal | None:
        record = self.database.in_flight(minibatch_id)
        issued_here = self.database.state(minibatch_id) is MinibatchState.ISSUED
        if not issued_here or record is None or (record.gu_id, record.attempt) != (gu_id, attempt):
            return StartRefusal.REVOKED
        if (gu_id, actor_id) in self.recovery.running_on:
            raise ProtocolError(
                f"GU {gu_id} actor {actor_id} asked to start minibatch {minibatch_id} while still running "
                f"{self.recovery.running_on[(gu_id, actor_id)]}; an actor decodes one minibatch at a time."
            )
        if policy_version > self.latest_version:
            raise ProtocolError(
                f"start requested with policy version {policy_version}, newer than the newest published "
                f"snapshot {self.latest_version}; report the version the actor actually holds."
            )
        if self.backpressure.paused:
            return StartRefusal.BACKPRESSURE
        return self.budget.check_start(self.database.minibatch(minibatch_id).num_prompts, policy_version)

    @_serialized
    def on_minibatch_completed(self, completed: CompletedMinibatch) -> IngestOutcome:
        deadline = self.budget.deadline(completed.policy_version)
        outcome, record, arrival = self.ingestor.receive(completed, deadline=deadline)
        if outcome is IngestOutcome.ACCEPTED:
            assert record is not None and arrival is not None
            # Only accepted work counts as generation: a dropped reply's time produced nothing.
            self.activity.on_generated(
                completed.gu_id,
                completed.actor_id,
                started_at=completed.started_at + completed.reload_seconds,  # reloads count as loading
                finished_at=completed.finished_at,
            )
            self.faults.forget(completed.minibatch_id)
            self.last_progress = self.clock.now()
            self.recovery.running_on.pop((completed.gu_id, completed.actor_id))
            self.sender.on_finished(completed.minibatch_id, completed.gu_id)
            self.timings.gen.add(completed.generation_seconds)
            timings = self.timings.current()
            estimate = (
                None if timings is None else eq4_d_off_estimate(arrival.depth_global_batches_before, timings)
            )
            self.lag.record_arrival(completed.minibatch_id, estimate)
            dropped = len(self.ingestor.last_filtered)  # dynamic sampling: consumed, never trained
            if dropped and self.sampling is not None:
                self.budget.release(dropped, completed.policy_version)
                self.prompts_consumed += dropped
                self.sampling.on_dropped(dropped, kept_queued=self.queue.depth_prompts)
            self._update_backpressure()
        self.events.append(ev.received(completed, outcome.value, self.clock.now()))
        return outcome

    @_serialized
    def on_actor_failed(self, gu_id: int, actor_id: int) -> list[int]:
        """An actor died; re-queue what it was running (``runtime/recovery.py``)."""
        return self.recovery.actor_failed(gu_id, actor_id)

    @_serialized
    def on_actor_fault(
        self, gu_id: int, actor_id: int, kind: FaultKind, detail: str, *, retire: bool
    ) -> list[int]:
        """An actor raised, hung or died; re-queue and count it (``Recovery.actor_fault``)."""
        return self.recovery.actor_fault(gu_id, actor_id, kind, detail, retire=retire)

    @_serialized
    def note_progress(self) -> None:
        """Work the trainer waited on finished outside the queue (an evaluation's decode): the
        stall clock restarts, as after a completion."""
        self.last_progress = self.clock.now()

    @property
    def fatal(self) -> PipelineFailure | None:
        """Set once the run cannot go on (poison minibatch, dynamic sampling): nothing is sent after."""
        return self.recovery.fatal or (self.sampling.failure if self.sampling is not None else None)

    @_serialized
    def failure(self) -> PipelineFailure | None:
        """Why the run cannot go on, if it cannot: a poison minibatch, no GU left with work left,
        or (``stall_timeout_s``) no progress for that long. The driver raises it."""
        if self.fatal is not None or self.is_finished():
            return self.fatal
        if not self.sender.gu_ids:
            return StalledPipeline(
                "no Generation Unit is left and "
                f"{self.database.num_prompts - self.prompts_consumed} prompts are not consumed; "
                "see the GU errors above (each GU's actors died or its process exited)."
            )
        timeout, now = self.config.stall_timeout_s, self.clock.now()
        if timeout is None or now - self.last_progress < timeout:
            return None
        return diagnose_stall(readout.stall_view(self, now), stall_timeout_s=timeout)

    @_serialized
    def on_gu_failed(self, gu_id: int) -> list[int]:
        """A whole GU died; re-queue its queued and running minibatches and stop sending to it."""
        return self.recovery.gu_failed(gu_id, "gu_failed")

    # ---- weight flow ---------------------------------------------------------------------------
    @property
    def latest_version(self) -> int:
        return self.weights.latest_version

    @_serialized
    def latest_snapshot(self) -> SnapshotInfo | None:
        """The snapshot every actor should reload to before its next minibatch (None: initial)."""
        return self.weights.latest

    @_serialized
    def on_snapshot_published(self, snapshot: SnapshotInfo, *, save_seconds: float | None = None) -> None:
        """A snapshot is complete on storage; GUs should be told (the adapter notifies them)."""
        self.weights.published(snapshot, save_seconds=save_seconds, steps_done=self.budget.next_step)
        self.last_progress = self.clock.now()

    @_serialized
    def on_snapshot_converted(
        self,
        gu_id: int,
        version: int,
        seconds: float,
        *,
        at: float | None = None,
        delta: Mapping[str, float] | None = None,
    ) -> None:
        """``at``: when the conversion ended (clock time), for a GU that batches its reports;
        ``delta``: the refresh's delta figures (``weight_delta`` auto / on)."""
        self.weights.converted(gu_id, version, seconds, at=at, delta=delta)

    @_serialized
    def on_weights_loaded(
        self, gu_id: int, actor_id: int, version: int, seconds: float, *, started_at: float | None = None
    ) -> None:
        """``started_at``: when the GU chose the target (clock time); see ``WeightFlowLedger.loaded``."""
        self.weights.loaded(gu_id, actor_id, version, seconds, started_at=started_at)

    # ---- training side -------------------------------------------------------------------------
    @_serialized
    def pop_global_batch(self, step: int) -> GlobalBatch | None:
        """The global batch for trainer step ``step``, or ``None`` if it must wait for rollouts."""
        if self._step_in_progress is not None:
            raise ProtocolError(
                f"step {self._step_in_progress[0]} is still training; call on_train_step_done before popping."
            )
        if step != self.budget.next_step:
            raise ProtocolError(
                f"trainer steps are consumed in order: expected step {self.budget.next_step}, got {step}."
            )
        candidates = self.queue.candidates(self.config.num_prompts_per_global_batch)
        full = len(candidates) == self.config.num_prompts_per_global_batch
        drained = self.database.all_completed() and not self.schedule_open
        if not full and self.sampling is not None and drained:
            self.sampling.on_exhausted(step, len(candidates))  # whole batches only
            return None
        if not candidates or not (full or drained):
            return None
        deadlines = [c.deadline for c in candidates]
        if not self.budget.can_consume(deadlines):
            self.trainer_lag_holds += 1
            return None
        batch = self.queue.take(candidates, step=step)
        if self.sampling is not None:
            batch = batch.with_filter_stats(self.sampling.filter.on_pop(batch.num_prompts))
        self.budget.consume(deadlines)
        lag = self.lag.on_consumed(batch)
        self.prompts_consumed += batch.num_prompts  # filtered prompts were counted when dropped
        now = self.clock.now()
        self._step_in_progress = (step, now)
        self.last_progress = now
        self._update_backpressure()
        self.events.append(
            ev.GlobalBatchPopped(
                time=now,
                step=step,
                num_prompts=batch.num_prompts,
                num_samples=batch.num_samples,
                d_off_max=lag.d_off_max,
            )
        )
        return batch

    @_serialized
    def on_train_step_done(
        self, step: int, snapshot: SnapshotInfo | None = None, *, save_seconds: float | None = None
    ) -> None:
        """Step ``step`` finished; ``snapshot`` (version ``step + 1``) if one was published with it."""
        if self._step_in_progress is None or self._step_in_progress[0] != step:
            raise ProtocolError(f"on_train_step_done({step}) without a popped global batch for that step.")
        now = self.clock.now()
        train_seconds = now - self._step_in_progress[1]
        self._step_in_progress = None
        self.last_progress = now
        self.timings.train.add(train_seconds)
        self.events.append(ev.TrainStepDone(time=now, step=step, train_seconds=train_seconds))
        if snapshot is not None:
            self.on_snapshot_published(snapshot, save_seconds=save_seconds)

    # ---- state -------------------------------------------------------------------------------
    def _update_backpressure(self) -> None:
        depth = self.queue.depth_samples
        if (flipped := self.backpressure.update(depth)) is not None:
            self.events.append(
                ev.BackpressureChanged(time=self.clock.now(), paused=flipped, depth_samples=depth)
            )

    @_serialized
    def extend_schedule(
        self, more: Sequence[ScheduledMinibatch], *, close: bool
    ) -> tuple[ScheduledMinibatch, ...]:
        """A streaming window's chunk (``close``: the last), renumbered after the whole schedule."""
        if not self.schedule_open:
            raise ProtocolError("extend_schedule: this schedule is closed (no asp_config.window)")
        self.config.check_minibatch_fits(max((mb.num_prompts for mb in more), default=0))
        added = self.database.extend(more)
        self.schedule_open, self.last_progress = not close, self.clock.now()
        return added

    @_serialized
    def replan_unsent(self, planner: replan.TailPlanner) -> replan.ReplanOutcome:
        """Online ASP: rebuild the unsent tail with ``planner`` (``runtime/replan.py``)."""
        return replan.replan_unsent(self.database, planner)

    @_serialized
    def is_finished(self) -> bool:
        """Every scheduled prompt has been consumed (trained on, or dropped by dynamic sampling);
        an over-sampling reserve still held is not needed."""
        expected = self.database.num_prompts - self.database.num_held_prompts
        return not self.schedule_open and self.prompts_consumed == expected

    @_serialized
    def summary(self) -> RuntimeSummary:
        # Whole-run figures only: no arrival or lag records (they may have been trimmed).
        return build_summary(
            self.observe(arrivals_since=len(self.queue.arrivals), lag_steps_since=len(self.lag.steps))
        )

    @_serialized
    def observe(self, *, arrivals_since: int = 0, lag_steps_since: int = 0) -> LoopObservation:
        """Every number outsiders report, as one record; the two logs from the given offsets."""
        return readout.observe(self, arrivals_since=arrivals_since, lag_steps_since=lag_steps_since)

    @_serialized
    def trim_history(self, *, arrivals: int, lag_steps: int) -> None:
        """Forget the arrival and lag records before a reader's cursor (the simulator never trims)."""
        self.queue.arrivals.trim(arrivals)
        self.lag.steps.trim(lag_steps)

    @property
    def queue_bound_samples(self) -> int:
        """``Q_max`` + one minibatch (the schedule's largest) per registered actor started before a pause."""
        in_flight = sum(self._actors_registered.values()) * self.database.max_minibatch_prompts
        return self.config.queue_max_samples + in_flight * self.config.num_samples_per_prompt

    @_serialized
    def check_invariants(self) -> None:
        """Cross-check the parts' bookkeeping (tests and debug runs)."""
        readout.check_invariants(self)
