"""Discrete-event simulator of the asynchronous pipeline, driving the real ``ControlLoop``.

::

   EventQueue (heap: time, kind, unit, seq) ──pop all events at t──► handlers ──► FakeClock.set(t)
        ▲                                                                │
        │  GEN_DONE  = start + DecodeModel(lengths of the minibatch)     ▼
        │  TRAIN_DONE = pop + TrainModel(tokens of the global batch)   react(): until nothing moves
        │  SAVE_DONE → publish → CONVERT_DONE per GU                      ├─ ControlLoop.dispatch() → GU input queues
        │  LOAD_DONE  (actor reloads before its next minibatch)           ├─ trainer idle? pop_global_batch(step)
        └──────────────────────────────────────────────────────────────── └─ each GU: pause? reload? request_start()

Only durations are modeled; every decision (dispatch, backpressure, lag admission, global-batch
assembly, lag accounting) is the runtime's own code, following the call sequence documented in
``mindspeed_rl.runtime``. Modeling choices (and departures from a real cluster): the snapshot
export runs beside training (the TU does not wait for it); each GU converts one snapshot at a
time and then the newest published one, skipping intermediate versions; an actor reloads to its
GU's newest *converted* snapshot just before taking a minibatch; CU↔GU messages are instant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mindspeed_rl.runtime import (
    Assignment,
    CompletedMinibatch,
    ControlLoop,
    EventLog,
    FakeClock,
    IngestOutcome,
    RuntimeConfig,
    Sample,
    ScheduledMinibatch,
    SnapshotInfo,
    StartRefusal,
)
from mindspeed_rl.sim.event_queue import EventKind, EventQueue, SimEvent
from mindspeed_rl.sim.result import SimResult, build_result
from mindspeed_rl.sim.timing import TimingProfile
from mindspeed_rl.sim.workload import Workload


class SimulationStalled(RuntimeError):
    """No event is pending but prompts are still unconsumed: the settings deadlock the pipeline."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterShape:
    num_gus: int
    actors_per_gu: int

    def __post_init__(self) -> None:
        if self.num_gus < 1 or self.actors_per_gu < 1:
            raise ValueError(
                f"need num_gus >= 1 and actors_per_gu >= 1, got {self.num_gus} and {self.actors_per_gu}."
            )

    @property
    def num_actors(self) -> int:
        return self.num_gus * self.actors_per_gu


@dataclass(slots=True)
class _Actor:
    version: int = 0
    busy: bool = False
    just_loaded: bool = False
    """Reloaded since its last minibatch: start with these weights even if a newer snapshot
    was converted meanwhile (one reload per minibatch at most, as deferred reload intends)."""


@dataclass(slots=True)
class _GenerationUnit:
    actors: list[_Actor]
    queue: deque[Assignment] = field(default_factory=deque)
    converted: int = 0
    converting: bool = False
    to_convert: int | None = None


class Simulator:
    def __init__(
        self,
        *,
        runtime: RuntimeConfig,
        cluster: ClusterShape,
        profile: TimingProfile,
        workload: Workload,
        schedule: Sequence[ScheduledMinibatch],
        seed: int = 0,
        label: str = "sim",
        check_invariants: bool = False,
        max_event_batches: int = 5_000_000,
    ) -> None:
        if runtime.num_samples_per_prompt != workload.num_samples_per_prompt:
            raise ValueError(
                f"runtime n={runtime.num_samples_per_prompt} but the workload has "
                f"{workload.num_samples_per_prompt} samples per prompt; make them equal."
            )
        self.runtime, self.cluster, self.profile, self.workload = runtime, cluster, profile, workload
        self.clock = FakeClock()
        self.events = EventLog()
        self.loop = ControlLoop(config=runtime, schedule=schedule, clock=self.clock, events=self.events)
        self._rows = {pid: i for i, pid in enumerate(workload.prompt_ids)}
        missing = [p for mb in schedule for p in mb.prompt_ids if p not in self._rows]
        if missing:
            raise ValueError(
                f"schedule names {len(missing)} prompts not in the workload (first {missing[0]!r})."
            )
        self._units = [
            _GenerationUnit(actors=[_Actor() for _ in range(cluster.actors_per_gu)])
            for _ in range(cluster.num_gus)
        ]
        self._queue = EventQueue()
        self._rng = np.random.default_rng([seed, 11])
        self._sigma = float(np.sqrt(np.log1p(profile.noise_cv**2)))
        self.label = label
        self._check = check_invariants
        self._max_batches = max_event_batches
        self._next_step = 0
        self._trainer_busy = False
        self.gen_seconds: list[float] = []

    # ---- main loop -------------------------------------------------------------------------
    def run(self) -> SimResult:
        for g, unit in enumerate(self._units):
            self.loop.register_gu(g, num_actors=len(unit.actors))
        self._react()
        for _ in range(self._max_batches):
            if self.loop.is_finished() and not self._trainer_busy:
                return build_result(self, condition=self.label)
            batch = self._queue.pop_simultaneous()
            if not batch:
                raise SimulationStalled(self._stall_message())
            self.clock.set(batch[0].time)
            for event in batch:
                self._handle(event)
            if self._check:
                self.loop.check_invariants()
            self._react()
        raise SimulationStalled(f"no end after {self._max_batches} event batches; raise max_event_batches.")

    def _stall_message(self) -> str:
        s = self.loop.summary()
        return (
            f"simulation stalled at t={self.clock.now():.1f}s with {s.prompts_consumed}/{s.prompts_scheduled} "
            f"prompts consumed, queue {self.loop.queue.depth_samples} samples, paused={self.loop.pause_signal()}, "
            f"refusals {s.starts_refused}; relax max_policy_lag or raise queue_max_samples."
        )

    def _handle(self, event: SimEvent) -> None:
        if event.kind is EventKind.GEN_DONE:
            self._on_gen_done(event)
        elif event.kind is EventKind.TRAIN_DONE:
            self._on_train_done(event.unit[0])
        elif event.kind is EventKind.SAVE_DONE:
            self._on_save_done(event.unit[0])
        elif event.kind is EventKind.CONVERT_DONE:
            self._on_convert_done(*event.unit)
        else:
            self._on_load_done(*event.unit)

    def _react(self) -> None:
        progress = True
        while progress:
            for a in self.loop.dispatch():
                self._units[a.gu_id].queue.append(a)
            progress = self._feed_trainer()
            for g in range(len(self._units)):
                progress = self._feed_unit(g) or progress

    # ---- generation --------------------------------------------------------------------------
    def _feed_unit(self, g: int) -> bool:
        unit, progress = self._units[g], False
        for a, actor in enumerate(unit.actors):
            if actor.busy or not unit.queue:
                continue
            if self.loop.pause_signal():
                return progress
            if actor.version < unit.converted and not actor.just_loaded:  # deferred reload
                self._start_reload(g, a)
                progress = True
                continue
            head = unit.queue[0]
            decision = self.loop.request_start(
                head.minibatch.minibatch_id,
                attempt=head.attempt,
                gu_id=g,
                actor_id=a,
                policy_version=actor.version,
            )
            if decision.granted:
                unit.queue.popleft()
                actor.just_loaded = False
                self._start_generation(head, g, a)
                progress = True
            elif decision.refusal is StartRefusal.REVOKED:
                unit.queue.popleft()
                progress = True
            elif decision.refusal is StartRefusal.STALE_WEIGHTS and actor.version < unit.converted:
                # A snapshot converted during the last reload is needed to meet the lag bound.
                self._start_reload(g, a)
                progress = True
            else:  # backpressure, lag budget, or weights too old until the next conversion
                return progress
        return progress

    def _start_reload(self, g: int, a: int) -> None:
        unit = self._units[g]
        unit.actors[a].busy = True
        self._push(self.profile.weight_flow.load_seconds, EventKind.LOAD_DONE, (g, a, unit.converted))

    def _start_generation(self, assignment: Assignment, g: int, a: int) -> None:
        actor, now, mb = self._units[g].actors[a], self.clock.now(), assignment.minibatch
        actor.busy = True
        rows = [self._rows[p] for p in mb.prompt_ids]
        seconds = self.profile.decode.minibatch_seconds(self.workload.lengths[rows]) * self._jitter()
        n = self.runtime.num_samples_per_prompt
        samples = tuple(
            Sample(
                prompt_id=p,
                sample_index=i,
                minibatch_id=mb.minibatch_id,
                response_token_ids=(),
                rollout_log_probs=(),
                reward=None,
                policy_version=actor.version,
                gu_id=g,
                actor_id=a,
                sent_at=assignment.issued_at,
            )
            for p in mb.prompt_ids
            for i in range(n)
        )
        completed = CompletedMinibatch(
            minibatch_id=mb.minibatch_id,
            attempt=assignment.attempt,
            samples=samples,
            gu_id=g,
            actor_id=a,
            policy_version=actor.version,
            started_at=now,
            finished_at=now + seconds,
        )
        self._push(seconds, EventKind.GEN_DONE, (g, a), completed)

    def _on_gen_done(self, event: SimEvent) -> None:
        completed = event.payload
        assert isinstance(completed, CompletedMinibatch)
        self._units[completed.gu_id].actors[completed.actor_id].busy = False
        outcome = self.loop.on_minibatch_completed(completed)
        assert outcome is IngestOutcome.ACCEPTED, f"fault-free run dropped minibatch {completed.minibatch_id}"
        self.gen_seconds.append(completed.generation_seconds)

    # ---- training and weight flow ------------------------------------------------------------
    def _feed_trainer(self) -> bool:
        if self._trainer_busy:
            return False
        batch = self.loop.pop_global_batch(self._next_step)
        if batch is None:
            return False
        rows = [self._rows[p] for p in batch.prompt_ids]
        tokens = int(self.workload.lengths[rows].sum())
        seconds = self.profile.train.step_seconds(tokens) * self._jitter()
        self._push(seconds, EventKind.TRAIN_DONE, (self._next_step,))
        self._trainer_busy = True
        self._next_step += 1
        return True

    def _on_train_done(self, step: int) -> None:
        self.loop.on_train_step_done(step)
        self._trainer_busy = False
        version = step + 1
        if version % self.runtime.snapshot_interval == 0:
            self._push(self.profile.weight_flow.save_seconds, EventKind.SAVE_DONE, (version,))

    def _on_save_done(self, version: int) -> None:
        snapshot = SnapshotInfo(
            version=version, path=f"sim://snapshot/{version}", created_at=self.clock.now()
        )
        self.loop.on_snapshot_published(snapshot, save_seconds=self.profile.weight_flow.save_seconds)
        for g, unit in enumerate(self._units):
            if unit.converting:
                unit.to_convert = version
            else:
                self._start_convert(g, version)

    def _start_convert(self, g: int, version: int) -> None:
        self._units[g].converting = True
        self._push(self.profile.weight_flow.convert_seconds, EventKind.CONVERT_DONE, (g, version))

    def _on_convert_done(self, g: int, version: int) -> None:
        unit = self._units[g]
        self.loop.on_snapshot_converted(g, version, self.profile.weight_flow.convert_seconds)
        unit.converted, unit.converting = max(unit.converted, version), False
        if unit.to_convert is not None and unit.to_convert > unit.converted:
            self._start_convert(g, unit.to_convert)
        unit.to_convert = None

    def _on_load_done(self, g: int, a: int, version: int) -> None:
        actor = self._units[g].actors[a]
        actor.version, actor.busy, actor.just_loaded = version, False, True
        self.loop.on_weights_loaded(g, a, version, self.profile.weight_flow.load_seconds)

    # ---- helpers -------------------------------------------------------------------------------
    def _push(self, delay: float, kind: EventKind, unit: tuple[int, ...], payload: object = None) -> None:
        self._queue.push(SimEvent(time=self.clock.now() + delay, kind=kind, unit=unit, payload=payload))

    def _jitter(self) -> float:
        """Mean-one log-normal factor (exactly 1 when ``noise_cv`` is 0, drawing nothing)."""
        if self._sigma == 0.0:
            return 1.0
        return float(np.exp(self._sigma * self._rng.standard_normal() - 0.5 * self._sigma**2))
