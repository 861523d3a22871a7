"""Discrete-event simulator of the asynchronous pipeline, driving the real ``ControlLoop``.

::

   EventQueue (heap: time, kind, unit, seq) ──pop all events at t──► handlers ──► FakeClock.set(t)
        ▲                                                                │
        │  GEN_DONE  = start + DecodeModel(lengths of the minibatch)     ▼
        │  TRAIN_DONE = pop + TrainModel(tokens of the global batch)   react(): until nothing moves
        │  SAVE_DONE → publish → CONVERT_DONE per GU                      ├─ ControlLoop.dispatch() → GU input queues
        │  LOAD_DONE  (actor reloads before its next minibatch)           ├─ trainer idle? pop_global_batch(step)
        └──────────────────────────────────────────────────────────────── └─ each GU: GuPolicy.next_actions()

Only durations are modeled; every decision (dispatch, backpressure, lag admission, global-batch
assembly, lag accounting) is the runtime's own code, following the call sequence documented in
``mindspeed_rl.runtime``; each GU is the production ``GuPolicy`` (conversion choice, reload /
start / wait / drop), so the simulated GU decides exactly as the Ray GU does. Modeling choices
(and departures from a real cluster): the snapshot export runs beside training (the TU does not
wait for it); conversion runs beside generation, as on the Ray GU; CU↔GU messages are instant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

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
    StartDecision,
)
from mindspeed_rl.runtime.gu_policy import GuPolicy, Reload, Start, StartGate, Wait
from mindspeed_rl.sim.event_queue import EventKind, EventQueue, SimEvent
from mindspeed_rl.sim.result import SimResult, build_result
from mindspeed_rl.sim.timing import TimingProfile
from mindspeed_rl.sim.workload import Workload


class LengthModel(Protocol):
    """Token counts of one generation of workload rows at run progress in [0, 1] (drift)."""

    def lengths(self, rows: Sequence[int], progress: float) -> np.ndarray: ...


class RunObserver(Protocol):
    """Online hooks: every generated minibatch's lengths, and every finished trainer step."""

    def on_generated(self, minibatch: ScheduledMinibatch, lengths: np.ndarray, now: float) -> None: ...

    def on_train_step_done(self, step: int, loop: ControlLoop, now: float) -> None: ...


class SimulationStalled(RuntimeError):
    """No event is pending but prompts are still unconsumed: the settings deadlock the pipeline."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterShape:
    num_generation_units: int
    actors_per_gu: int

    def __post_init__(self) -> None:
        if self.num_generation_units < 1 or self.actors_per_gu < 1:
            raise ValueError(
                "need num_generation_units >= 1 and actors_per_gu >= 1, got "
                f"{self.num_generation_units} and {self.actors_per_gu}."
            )

    @property
    def num_actors(self) -> int:
        return self.num_generation_units * self.actors_per_gu


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
        length_model: LengthModel | None = None,
        observer: RunObserver | None = None,
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
            GuPolicy(gu_id=g, actor_ids=range(cluster.actors_per_gu))
            for g in range(cluster.num_generation_units)
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
        # Drift: lengths depend on when a prompt is generated, so training reads them back.
        self._length_model, self._observer = length_model, observer
        self._generated: dict[int, np.ndarray] = {}
        self._num_steps = -(-workload.num_prompts // runtime.num_prompts_per_global_batch)

    @property
    def num_steps(self) -> int:
        """Trainer steps of the run (progress of the drift model = policy version / this)."""
        return self._num_steps

    # ---- main loop -------------------------------------------------------------------------
    def run(self) -> SimResult:
        for g, unit in enumerate(self._units):
            self.loop.register_gu(g, num_actors=len(unit.slots))
        self._react()
        for _ in range(self._max_batches):
            if self.loop.is_finished() and not self._trainer_busy:
                return build_result(self.loop.observe(), self.events, self.gen_seconds, condition=self.label)
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
        s = self.loop.observe()
        return (
            f"simulation stalled at t={self.clock.now():.1f}s with {s.prompts_consumed}/{s.prompts_scheduled} "
            f"prompts consumed, queue {s.queue_depth_samples} samples, paused={s.paused}, "
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
        progress = False
        for action in self._units[g].next_actions(
            paused=self.loop.pause_signal(), request_start=self._gate(g)
        ):
            if isinstance(action, Reload):
                self._push(
                    self.profile.weight_flow.load_seconds,
                    EventKind.LOAD_DONE,
                    (g, action.actor_id, action.version),
                )
            elif isinstance(action, Start):
                self._start_generation(action.assignment, g, action.actor_id, action.policy_version)
            progress = progress or not isinstance(action, Wait)
        return progress

    def _gate(self, g: int) -> StartGate:
        def request_start(assignment: Assignment, *, actor_id: int, policy_version: int) -> StartDecision:
            return self.loop.request_start(
                assignment.minibatch.minibatch_id,
                attempt=assignment.attempt,
                gu_id=g,
                actor_id=actor_id,
                policy_version=policy_version,
            )

        return request_start

    def _start_generation(self, assignment: Assignment, g: int, a: int, version: int) -> None:
        now, mb = self.clock.now(), assignment.minibatch
        rows = [self._rows[p] for p in mb.prompt_ids]
        lengths = self._lengths_now(rows, version)
        seconds = self.profile.decode.minibatch_seconds(lengths) * self._jitter()
        n = self.runtime.num_samples_per_prompt
        samples = tuple(
            Sample(
                prompt_id=p,
                sample_index=i,
                minibatch_id=mb.minibatch_id,
                response_token_ids=(),
                rollout_log_probs=(),
                reward=None,
                policy_version=version,
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
            policy_version=version,
            started_at=now,
            finished_at=now + seconds,
        )
        self._push(seconds, EventKind.GEN_DONE, (g, a), (completed, mb, lengths))

    def _on_gen_done(self, event: SimEvent) -> None:
        assert isinstance(event.payload, tuple)
        completed, mb, lengths = event.payload
        assert isinstance(completed, CompletedMinibatch)
        self._units[completed.gu_id].on_generation_done(completed.actor_id)
        outcome = self.loop.on_minibatch_completed(completed)
        assert outcome is IngestOutcome.ACCEPTED, f"fault-free run dropped minibatch {completed.minibatch_id}"
        self.gen_seconds.append(completed.generation_seconds)
        if self._length_model is not None:
            for row, length in zip((self._rows[p] for p in mb.prompt_ids), lengths):
                self._generated[row] = length
        if self._observer is not None:
            self._observer.on_generated(mb, lengths, self.clock.now())

    # ---- training and weight flow ------------------------------------------------------------
    def _feed_trainer(self) -> bool:
        if self._trainer_busy:
            return False
        batch = self.loop.pop_global_batch(self._next_step)
        if batch is None:
            return False
        rows = [self._rows[p] for p in batch.prompt_ids]
        if self._length_model is None:
            tokens = int(self.workload.lengths[rows].sum())
        else:
            tokens = int(sum(self._generated.pop(r).sum() for r in rows))
        seconds = self.profile.train.step_seconds(tokens) * self._jitter()
        self._push(seconds, EventKind.TRAIN_DONE, (self._next_step,))
        self._trainer_busy = True
        self._next_step += 1
        return True

    def _on_train_done(self, step: int) -> None:
        self.loop.on_train_step_done(step)
        self._trainer_busy = False
        if self._observer is not None:
            self._observer.on_train_step_done(step, self.loop, self.clock.now())
        version = step + 1
        if version % self.runtime.snapshot_interval == 0:
            self._push(self.profile.weight_flow.save_seconds, EventKind.SAVE_DONE, (version,))

    def _on_save_done(self, version: int) -> None:
        snapshot = SnapshotInfo(
            version=version, path=f"sim://snapshot/{version}", created_at=self.clock.now()
        )
        self.loop.on_snapshot_published(snapshot, save_seconds=self.profile.weight_flow.save_seconds)
        for g, unit in enumerate(self._units):
            unit.on_snapshot_published(snapshot)
            self._start_conversion(g)

    def _start_conversion(self, g: int) -> None:
        snapshot = self._units[g].next_conversion()
        if snapshot is not None:
            self._push(
                self.profile.weight_flow.convert_seconds, EventKind.CONVERT_DONE, (g, snapshot.version)
            )

    def _on_convert_done(self, g: int, version: int) -> None:
        self.loop.on_snapshot_converted(g, version, self.profile.weight_flow.convert_seconds)
        self._units[g].on_converted(version, path=f"sim://gu{g}/{version}")
        self._start_conversion(g)

    def _on_load_done(self, g: int, a: int, version: int) -> None:
        self._units[g].on_reloaded(a, version, ok=True)
        self.loop.on_weights_loaded(g, a, version, self.profile.weight_flow.load_seconds)

    # ---- helpers -------------------------------------------------------------------------------
    def _push(self, delay: float, kind: EventKind, unit: tuple[int, ...], payload: object = None) -> None:
        self._queue.push(SimEvent(time=self.clock.now() + delay, kind=kind, unit=unit, payload=payload))

    def _lengths_now(self, rows: list[int], version: int) -> np.ndarray:
        if self._length_model is None:
            return self.workload.lengths[rows]
        return self._length_model.lengths(rows, version / self._num_steps)

    def _jitter(self) -> float:
        """Mean-one log-normal factor (exactly 1 when ``noise_cv`` is 0, drawing nothing)."""
        if self._sigma == 0.0:
            return 1.0
        return float(np.exp(self._sigma * self._rng.standard_normal() - 0.5 * self._sigma**2))
