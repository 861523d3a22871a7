"""The Generation Unit: the control process of a group of generation actors (a threaded Ray actor).

::

    run():  until finished / stopped / no actors left
      ray.wait(num_returns=1) on ─┬─ CU.poll(g, wait_s)         long-poll: returns on news for this GU
                                  ├─ actor receipts / reloads   generate_with_receipt / reload
                                  └─ self.convert_snapshot(v)   on another thread of this actor
      poll answered ──► policy: assignments, evaluations, newest published snapshot; next long-poll issued
      actor done    ──► completion queued for the CU | reload queued for the CU
                        | evaluation ─► CU.on_eval_done | dead actor ─► CU.on_actor_failed
      converted     ──► policy: newest converted (idle actors reload to it); conversion queued for the CU
      then: policy.next_conversion() ─► start converting (newest published only)
            policy.next_actions(paused, gate) ─► Reload / Start on idle actors, where
              gate = CU.exchange(queued reports + completions, start request) ─► decision + news
            reports still queued (no start was asked, no reload to wait for) ─► CU.exchange(reports)

Every decision (reload / start / wait / drop, which snapshot to convert) is ``GuPolicy``'s,
the same object the simulator and the tests drive; this class only moves calls and bytes, and
as few of them as it can: the control plane's CPU is Ray's per-call cost, so what the CU must
hear rides on the next call the GU makes anyway (``ControlUnit.exchange``). A completion goes
with the start request of the actor that just freed up. When that actor reloads first, it waits
for the start request after the reload, at most ``completion_hold_seconds``; when the policy asks
for no start (the queue is empty, the pipeline is paused), it goes on its own at once. The
samples are not opened here: an actor returns a small receipt and the samples as two objects;
the GU reads the receipt (which raises if the actor died) and hands the samples' ObjectRef to
the CU, where Ray resolves it.

Conversion runs beside the loop, so actors keep generating on the previous version and
completions keep flowing while the next snapshot converts. The loop sleeps in one ``ray.wait``
until something happens: no periodic polling (the long-poll's ``wait_s`` is only a safety net).

The GU itself keeps no authoritative state; if it dies, the CU re-queues everything it held.
An actor that dies, raises inside generate, or runs past its bound (``runtime.minibatch_deadline``; the loop's
wait also wakes at the earliest such deadline) is killed and replaced in the background, up to
``actor_max_restarts`` per slot; the CU re-issues its minibatch and counts the failed attempt
(a minibatch failing ``minibatch_max_attempts`` times fails the run as poison input). A slot out
of restarts is retired: the GU carries on with the actors it has left (a GU left without actors
is failed by the CU).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, cast

from mindspeed_rl.runtime.faults import FaultKind
from mindspeed_rl.runtime.gu_policy import Action, Drop, Evaluate, EvalUnavailable, GuPolicy, Reload, Start
from mindspeed_rl.runtime.minibatch_deadline import DeadlineSettings, RunningMinibatches
from mindspeed_rl.runtime.records import Assignment, StartDecision
from mindspeed_rl.workers.gu_messages import (
    ConversionReport,
    GuFaultSettings,
    GuPoll,
    GuReport,
    ReloadReport,
    StartRequest,
)
from mindspeed_rl.workers.gu_spec import ConversionDone, GuSpec
from mindspeed_rl.workers.gu_weights import GuWeightSide

if TYPE_CHECKING:
    from mindspeed_rl.weights.collective_backend import Backend
    from mindspeed_rl.workers.evaluator import EvalJob

logger = logging.getLogger(__name__)
# An evaluation whose decode killed this many actors is reported failed, not tried again.
MAX_EVAL_ATTEMPTS = 2


class GenerationUnit:
    def __init__(self, spec: GuSpec, control: Any) -> None:
        self.spec = spec
        self.gu_id = spec.gu_id
        self._cu = control
        self._policy = GuPolicy(gu_id=spec.gu_id, actor_ids=())
        self._handles: dict[int, Any] = {}
        # ref -> ("generate" | "reload" | "ready" | "eval", actor)
        self._pending: dict[Any, tuple[str, int]] = {}
        self._eval_failures: Counter[int] = Counter()  # job id -> actors lost while decoding it
        self._num_started: Counter[int] = Counter()  # per actor slot, across its replacements
        self._num_evals: Counter[int] = Counter()  # evaluation decodes, likewise
        self._restarts: Counter[int] = Counter()
        self._starting: set[int] = set()  # slots whose replacement engine is coming up
        self._faults = GuFaultSettings(
            deadlines=DeadlineSettings(fixed_s=None, factor=None, floor_s=1.0, warmup_s=1.0, stall_s=None),
            actor_max_restarts=0,
        )
        self._running = RunningMinibatches(self._faults.deadlines)  # generate receipts in flight
        self._samples: dict[Any, Any] = {}  # generate receipt ref -> the samples' ref, not opened here
        self._reload_chosen_at: dict[int, float] = {}
        # version -> answer time of the poll it was chosen on: it was the newest published then.
        self._conversion_chosen_at: dict[int, float] = {}
        self._stop = threading.Event()
        self._weights = GuWeightSide(spec)
        self._paused = False
        self._answered_at = 0.0
        self._seq = 0  # of the newest CU answer applied
        self._ended = False  # a CU answer said the run is finished or this GU was failed
        # What the CU has not heard yet; it rides on the next exchange (see the module docstring).
        self._completions: list[tuple[int, Any]] = []  # (actor id, the samples' ref)
        self._held_since: float | None = None  # when the oldest unreported completion came in
        self._reloads: list[ReloadReport] = []
        self._conversions: list[ConversionReport] = []
        self._answers: list[GuPoll] = []  # exchange answers not applied yet
        self.num_forwarded = 0
        self.calls: Counter[str] = Counter()
        """Calls the control loop made (CU, actors, ``ray.wait``): the breakdown of its CPU."""
        self._cpu_at_start = time.process_time()

    def launch_actors(self) -> int:
        """Create the actors without waiting for them: their engines load and warm up while the
        run's other start-up steps go on (``async_cluster._bring_up``). Idempotent."""
        for a in range(self.spec.num_actors):
            if a not in self._handles:
                self._handles[a] = self._new_actor(a)
        return len(self._handles)

    def start_actors(self) -> int:
        """Create the actors (unless ``launch_actors`` did), wait until their engines are up,
        register with the CU."""
        import ray

        self.launch_actors()
        ray.get([handle.__ray_ready__.remote() for handle in self._handles.values()])
        # A device channel (NCCL / HCCL) receives on the first actor's device: known only now.
        self._weights.bind_receiver_device(self._handles[0])
        self._policy = GuPolicy(gu_id=self.gu_id, actor_ids=self._handles)
        self._faults = ray.get(self._cu.register_gu.remote(self.gu_id, len(self._handles)))
        self._running = RunningMinibatches(self._faults.deadlines)
        return len(self._handles)

    def _new_actor(self, a: int) -> Any:
        import ray

        from mindspeed_rl.workers.generation_actor import GenerationActor

        s = self.spec
        options = s.per_actor_options[a] if s.per_actor_options else s.actor_options
        # A replacement gets its own seed, so a sampling-dependent failure is not replayed exactly.
        seed = s.seed + 1000 * self.gu_id + a + 100_000 * self._restarts[a]
        return (
            ray.remote(GenerationActor)
            .options(**options, max_restarts=0)
            .remote(
                s.rollout,
                s.policy_path,
                s.prompts,
                gu_id=self.gu_id,
                actor_id=a,
                seed=seed,
                forced_lengths=s.forced_lengths,
                # Partial rollouts: the actor asks this GU for newer weights between decoding rounds.
                snapshot_source=ray.get_runtime_context().current_actor if s.rollout.partial else None,
            )
        )

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> dict[str, int]:
        """The control loop; returns counts when the run is finished, stopped or out of actors."""
        import ray

        me = ray.get_runtime_context().current_actor
        # Engine start-up (actors, imports) is not control-plane work: count from here.
        self._cpu_at_start = time.process_time()
        self._weights.reset_cpu()
        poll_ref = self._cu.poll.remote(self.gu_id)
        converting: Any = None
        # Beyond the long-poll's own wait: only reached if the CU stops answering.
        timeout = self.spec.poll_wait_seconds + 30.0
        while not self._stop.is_set() and (self._policy.slots or self._starting) and not self._ended:
            waiting = [poll_ref, *self._pending] + ([converting] if converting is not None else [])
            ready, _ = ray.wait(waiting, num_returns=1, timeout=self._wait_timeout(timeout))
            self.calls["ray.wait"] += 1
            for ref in ready:
                if ref == poll_ref:
                    self._apply(ray.get(ref))
                    if self._ended:
                        break
                    poll_ref = self._cu.poll.remote(self.gu_id, self.spec.poll_wait_seconds)
                    self.calls["cu.poll"] += 1
                elif ref == converting:
                    converting = None
                    self._on_converted(ray.get(ref))
                else:
                    self._finish(ref)
            self._expire_timeouts()
            if self._ended:
                break
            if converting is None and (target := self._policy.next_conversion()) is not None:
                converting = me.convert_snapshot.remote(target.version, target.path, target.handle)
                self.calls["convert_snapshot"] += 1
                self._conversion_chosen_at[target.version] = self._answered_at
            self._act()
        if not self._ended and (self._completions or self._reloads or self._conversions):
            self._exchange(None)  # stopped: the run's summary still gets what this GU last did
        return self._counts()

    def _wait_timeout(self, longest: float) -> float:
        """How long the loop may sleep: a held completion must go out when its hold ends, and a
        running minibatch must be checked at its timeout (the only other wake-ups: no polling)."""
        now = time.monotonic()
        wakes = [longest, *(d - now for d in self._running.deadlines())]
        if self._held_since is not None:
            wakes.append(self._held_since + self.spec.completion_hold_seconds - now)
        return max(0.0, min(wakes))

    def _counts(self) -> dict[str, int]:
        return {"forwarded": self.num_forwarded, "actors_alive": len(self._policy.slots)}

    def cpu_seconds(self) -> float:
        """CPU of the control loop since ``run`` began: this process (all threads, Ray's
        included) less the conversion thread's share (``convert_cpu_seconds``)."""
        return time.process_time() - self._cpu_at_start - self._weights.convert_cpu_seconds

    def call_counts(self) -> dict[str, int]:
        return dict(self.calls)

    def actor_env_reports(self, modules: tuple[str, ...]) -> list[Any]:
        """Each live actor's own environment report (``utils.env_probe``), for summary.json."""
        import ray

        from mindspeed_rl.utils.env_probe import report_of_process

        return ray.get([h.__ray_call__.remote(report_of_process, modules) for h in self._handles.values()])

    def convert_cpu_seconds(self) -> float:
        """CPU the snapshot conversions used since ``run`` began (weight flow, not control)."""
        return self._weights.convert_cpu_seconds

    def shutdown(self) -> None:
        import ray

        for handle in self._handles.values():
            ray.kill(handle)
        self._handles.clear()
        self._policy.slots.clear()

    # ---- weight flow -----------------------------------------------------------------------------
    def check_probe(self, probe: Any) -> str:
        """Start of the run, before any model work (``gu_weights.GuWeightSide.check_probe``)."""
        return self._weights.check_probe(probe)

    def open_weight_channel(self, world_size: int, backend: Backend) -> Any:
        """collective: this GU's one process group, opened once at start (``weights.transports``)."""
        return self._weights.open_channel(world_size, backend)

    def delta_stats(self) -> dict[str, float]:
        """``weight_delta`` auto / on: this GU's delta totals for summary.json ({} when off)."""
        return self._weights.delta_stats()

    def convert_snapshot(self, version: int, path: str, handle: Any = None) -> ConversionDone:
        """Convert one published snapshot (called on another thread of this actor by ``run``)."""
        return self._weights.convert(version, path, handle)

    def _on_converted(self, done: ConversionDone) -> None:
        self._policy.on_converted(done.version, path=done.path)
        if done.path is not None:
            self._conversions.append(
                ConversionReport(
                    version=done.version, seconds=done.seconds, finished_at=time.time(), delta=done.delta
                )
            )

    def newest_converted(self, held_version: int) -> tuple[str, int, Any] | None:
        """Partial rollouts: the newest snapshot converted for this GU, if newer than
        ``held_version`` (path, version, memory handle or None). An actor asks between two decoding
        rounds; this runs on another of this actor's threads while ``run`` loops, and only reads."""
        target = self._policy.converted
        if target is None or target.version <= held_version:
            return None
        return target.path, target.version, self._weights.reload_handle(target.path)

    def _apply(self, poll: GuPoll) -> bool:
        """Take in one CU answer; returns whether it brought something an idle actor may act on."""
        self._ended = self._ended or poll.finished or not poll.gu_known
        newest = poll.seq > self._seq
        # An older answer read late (a poll overtaken by an exchange) holds work issued earlier.
        self._policy.add_assignments(poll.assignments, ahead=not newest)
        for job in poll.eval_jobs:
            self._policy.add_eval(job)
        if poll.latest_snapshot is not None:
            self._policy.on_snapshot_published(poll.latest_snapshot)
        resumed = False
        if newest:
            resumed = self._paused and not poll.paused
            self._seq, self._paused, self._answered_at = poll.seq, poll.paused, poll.answered_at
        return bool(poll.assignments or poll.eval_jobs) or resumed

    # ---- starting work -----------------------------------------------------------------------------
    def _act(self) -> None:
        """Run the policy on the idle actors; report what the CU has not heard; repeat while the
        CU's answers bring new work for actors left idle."""
        while not self._ended:
            self._launch(self._policy.next_actions(paused=self._paused, request_start=self._request_start))
            if (self._completions or self._reloads) and not self._may_hold():
                self._exchange(None)  # no start request carried them: send them now
            answers, self._answers = self._answers, []
            news = [self._apply(answer) for answer in answers]
            if not (any(news) and any(slot.idle for slot in self._policy.slots.values())):
                return

    def _launch(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Reload):
                handle = self._handles[action.actor_id]
                memory = self._weights.reload_handle(action.path)  # None: a folder (shared_fs)
                self._pending[handle.reload.remote(action.path, action.version, memory)] = (
                    "reload",
                    action.actor_id,
                )
                self.calls["actor.reload"] += 1
                # Judged against what was published when its conversion was chosen: a snapshot
                # published while the previous one converted is picked up by the next reload.
                self._reload_chosen_at[action.actor_id] = self._conversion_chosen_at[action.version]
            elif isinstance(action, Start):
                a = action.assignment
                self._num_started[action.actor_id] += 1
                fault = self.spec.faults.actor_fault(
                    self.gu_id, action.actor_id, self._num_started[action.actor_id]
                )
                receipt, samples = (
                    self._handles[action.actor_id]
                    .generate_with_receipt.options(num_returns=2)
                    .remote(
                        a.minibatch, attempt=a.attempt, sent_at=a.issued_at, fault=fault, records=a.records
                    )
                )
                self._pending[receipt] = ("generate", action.actor_id)
                self._running.start(receipt, action.actor_id, a.minibatch.predicted_load, time.monotonic())
                self.calls["actor.generate"] += 1
                self._samples[receipt] = samples
            elif isinstance(action, Evaluate):
                job = cast("EvalJob", action.job)
                self._num_evals[action.actor_id] += 1
                fault = self.spec.faults.eval_fault(
                    self.gu_id, action.actor_id, self._num_evals[action.actor_id]
                )
                ref = self._handles[action.actor_id].decode_held_out.remote(job, fault=fault)
                self._pending[ref] = ("eval", action.actor_id)
                # A hung engine is caught here too: bounded as a minibatch of the decode's most
                # tokens would be (never measured: that load is a bound, not a prediction).
                self._running.start(ref, action.actor_id, float(job.max_new_tokens), time.monotonic())
                self.calls["actor.decode_held_out"] += 1
            elif isinstance(action, EvalUnavailable):
                self._eval_done(action.job.job_id, None, action.reason)
            elif isinstance(action, Drop):
                logger.info(
                    "GU %d: minibatch %d revoked", self.gu_id, action.assignment.minibatch.minibatch_id
                )

    def _may_hold(self) -> bool:
        """Whether the unreported completions may wait for a start request: each one's actor is
        reloading (its start comes right after), and the oldest has not waited its limit yet.
        Meanwhile the CU counts the actor as busy, so news meant for idle actors does not wake
        this GU either."""
        if (
            self._held_since is None
            or time.monotonic() - self._held_since >= self.spec.completion_hold_seconds
        ):
            return False
        slots = self._policy.slots
        return all(a in slots and slots[a].reloading_to is not None for a, _ in self._completions)

    def _request_start(self, assignment: Assignment, *, actor_id: int, policy_version: int) -> StartDecision:
        """The policy's start gate: one ``exchange`` that also carries everything queued for the CU.
        Its news is applied once the policy's round is over (``_act``), not inside it."""
        answer = self._exchange(
            StartRequest(
                minibatch_id=assignment.minibatch.minibatch_id,
                attempt=assignment.attempt,
                actor_id=actor_id,
                policy_version=policy_version,
            )
        )
        assert answer.decision is not None, "the CU answers every start request"
        return answer.decision

    def _exchange(self, start: StartRequest | None) -> GuPoll:
        import ray

        report = GuReport(
            gu_id=self.gu_id, reloads=tuple(self._reloads), conversions=tuple(self._conversions), start=start
        )
        completions = [samples for _, samples in self._completions]
        self._completions, self._reloads, self._conversions, self._held_since = [], [], [], None
        answer: GuPoll = ray.get(self._cu.exchange.remote(report, *completions))
        self.calls["cu.exchange" if start is not None else "cu.exchange_report_only"] += 1
        self._answers.append(answer)
        before, self.num_forwarded = self.num_forwarded, self.num_forwarded + len(completions)
        dies_after = self.spec.faults.gu_dies.get(self.gu_id)
        if dies_after is not None and before < dies_after <= self.num_forwarded:
            logger.error("fault injection: GU %d exits", self.gu_id)
            os._exit(1)
        return answer

    # ---- completions -------------------------------------------------------------------------------
    def _finish(self, ref: Any) -> None:
        import ray

        kind, actor_id = self._pending.pop(ref)
        samples = self._samples.pop(ref, None)
        run = self._running.pop(ref)
        try:
            result = ray.get(ref)  # a receipt or a reload result: small, and raises if the actor died
        except ray.exceptions.RayActorError as err:
            self._on_actor_fault(actor_id, FaultKind.DIED, f"{kind}: {type(err).__name__}")
            return
        except ray.exceptions.RayTaskError as err:  # the engine raised; the process may be broken
            self._on_actor_fault(actor_id, FaultKind.ERROR, f"{kind}: {_last_line(err)}")
            return
        if kind == "ready":
            self._starting.discard(actor_id)
            self._policy.add_actor(actor_id)
            logger.warning("GU %d: replacement actor %d is up", self.gu_id, actor_id)
            return
        if kind == "reload":
            self._on_reloaded(actor_id, result)
            return
        if kind == "eval":
            self._eval_done(self._policy.on_eval_done(actor_id).job_id, result, None)
            return
        if run is not None:
            self._running.succeeded(run, time.monotonic(), tool_seconds=result.max_tool_seconds)
        self._policy.on_generation_done(actor_id, held_version=result.held_version)
        for version, seconds in result.reloads:  # partial rollouts: reloads inside the minibatch
            self._reloads.append(
                ReloadReport(
                    actor_id=actor_id,
                    version=version,
                    seconds=seconds,
                    chosen_at=self._conversion_chosen_at.get(version, time.time()),
                )
            )
        self._completions.append((actor_id, samples))
        if self._held_since is None:
            self._held_since = time.monotonic()

    # ---- faults ------------------------------------------------------------------------------------
    def _expire_timeouts(self) -> None:
        """Kill the actors whose minibatch ran past its bound (a hung engine; ``runtime.minibatch_deadline``)."""
        for ref, actor_id, why in self._running.expired(time.monotonic()):
            if ref in self._pending:
                self._on_actor_fault(actor_id, FaultKind.TIMEOUT, why)

    def _on_actor_fault(self, actor_id: int, kind: FaultKind, detail: str) -> None:
        """Take the actor out, tell the CU (it re-issues the minibatch), and start a replacement
        unless the slot has used its ``actor_max_restarts``."""
        import ray

        starting = actor_id in self._starting
        self._starting.discard(actor_id)
        evaluating = None if starting else self._policy.slots[actor_id].evaluating
        lost = None if starting else self._policy.on_actor_died(actor_id)
        if evaluating is not None:  # the policy re-queued it; twice lost is the job's fault
            self._eval_failures[evaluating.job_id] += 1
            if self._eval_failures[evaluating.job_id] >= MAX_EVAL_ATTEMPTS:
                self._policy.evals.remove(evaluating)
                self._eval_done(evaluating.job_id, None, f"{MAX_EVAL_ATTEMPTS} actors failed on it: {detail}")
        what = f"minibatch {lost.minibatch.minibatch_id}" if lost else "no minibatch"
        logger.error("GU %d: actor %d %s during %s (%s)", self.gu_id, actor_id, kind.value, what, detail)
        for ref in [r for r, (_, a) in self._pending.items() if a == actor_id]:
            del self._pending[ref]
            self._samples.pop(ref, None)
            self._running.pop(ref)
        handle = self._handles.pop(actor_id, None)
        if handle is not None and kind is not FaultKind.DIED:
            ray.kill(handle)  # a hung or failing engine is not trusted with another minibatch
        if self._completions:  # the CU must not re-issue a minibatch that is done, only unreported
            self._exchange(None)
        retire = self._restarts[actor_id] >= self._faults.actor_max_restarts
        self.calls["cu.on_actor_fault"] += 1
        ray.get(self._cu.on_actor_fault.remote(self.gu_id, actor_id, kind.value, detail, retire))
        if retire:
            return
        self._restarts[actor_id] += 1
        self._running.engine_replaced(actor_id)
        self._handles[actor_id] = handle = self._new_actor(actor_id)
        self._pending[handle.__ray_ready__.remote()] = ("ready", actor_id)
        self._starting.add(actor_id)

    def _eval_done(self, job_id: int, decoded: Any, error: str | None) -> None:
        import ray

        self.calls["cu.on_eval_done"] += 1
        ray.get(self._cu.on_eval_done.remote(self.gu_id, job_id, decoded, error))

    def _on_reloaded(self, actor_id: int, result: Any) -> None:
        target = self._policy.slots[actor_id].reloading_to
        assert target is not None, "a reload finished on an actor that was not reloading"
        if result.status == "loaded":
            self._policy.on_reloaded(actor_id, target, ok=True)
            self._reloads.append(
                ReloadReport(
                    actor_id=actor_id,
                    version=result.version,
                    seconds=result.load_seconds,
                    chosen_at=self._reload_chosen_at[actor_id],
                )
            )
            return
        # "up_to_date": the engine already holds it; anything else: never offer it to this actor again.
        self._policy.on_reloaded(actor_id, target, ok=result.status == "up_to_date")
        if result.status == "rejected":
            logger.error(
                "GU %d actor %d rejected snapshot v%s: %s",
                self.gu_id,
                actor_id,
                result.target_version,
                result.reason,
            )


def _last_line(err: Exception) -> str:
    """The remote exception's own message (the last line of Ray's traceback text)."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(err).__name__
