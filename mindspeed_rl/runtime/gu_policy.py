"""The Generation Unit's decisions, as one plain object that every GU driver runs.

::

    CU ── assignments ──────────► add_assignments ──► input queue (FIFO of Assignment)
    CU ── newest snapshot ──────► on_snapshot_published ─┐
                                   next_conversion() ◄────┘  newest published only, one at a time,
                                        │                    never a version that failed to convert
          converter (concurrent) ◄──────┘
                 └─ on_converted(v, path | None) ──► newest converted snapshot

    next_actions(paused, request_start), for each idle actor in actor order:
        queue empty ─────────────────────────────► Wait(EMPTY_QUEUE), next actor
        paused ──────────────────────────────────► Wait(PAUSED) for every idle actor, stop
        newer converted, not reloaded since its
          last minibatch, not rejected by it ────► Reload(newest converted)
        request_start(head, version it holds):
            granted ─────────────────────────────► Start(head)
            REVOKED ─────────────────────────────► Drop(head), ask again with the next head
            STALE_WEIGHTS / POLICY_LAG and a
              newer converted snapshot ──────────► Reload(newest converted)
            BACKPRESSURE / POLICY_LAG / STALE ───► Wait(reason) for every idle actor, stop

    evaluations (add_eval), before any of the above, on the idle actors:
        an idle actor holds >= the job's version ─► Evaluate(job) on it
        else the newest converted is new enough ──► Reload(newest converted) on one idle actor
        its version failed to convert ────────────► EvalUnavailable(job)
        else (converting, or every actor busy) ───► the job waits; generation goes on

    driver ── on_generation_done / on_reloaded / on_eval_done / on_actor_died ──► actor slots

Drivers: the Ray ``GenerationUnit`` (actors are Ray actors, conversion runs on a worker thread),
the simulator (durations are modeled) and the tests' fake pipeline. They only move bytes and
time; every choice of what an actor does next is made here, so the invariant tests exercise
the rules production runs.

Why the rules are what they are:

* An actor reloads just before it takes a minibatch, never while it has nothing to start (queue
  empty or paused): it then starts with the newest weights converted by that moment, and a long
  pause does not cost one reload per snapshot published during it.
* At most one reload per minibatch: a snapshot converted while an actor reloads waits for its
  next minibatch, unless the CU refuses the start for lag (``STALE_WEIGHTS`` or ``POLICY_LAG``)
  and the newer snapshot's later deadline would admit it. Without that exception a GU can
  deadlock: its queued work is what the trainer waits for, and the trainer's next step is what
  would lift the lag refusal of the weights it holds.
* An evaluation goes before queued work and is not held by a pause, backpressure or the lag
  gate: it trains nothing, and the trainer waits for its result. Exactly one actor decodes it,
  on the version the job names or newer (the trainer waits, so nothing newer is published).
* ``BACKPRESSURE`` and ``POLICY_LAG`` hold for every idle actor of the GU until the CU's state
  changes, so asking again for the other actors in the same round would only cost RPCs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from mindspeed_rl.runtime.records import Assignment, SnapshotInfo, StartDecision, StartRefusal


class WaitReason(Enum):
    EMPTY_QUEUE = "empty_queue"
    PAUSED = "paused"
    BACKPRESSURE = "backpressure"
    POLICY_LAG = "policy_lag"
    STALE_WEIGHTS = "stale_weights"


_WAIT_FOR_REFUSAL = {
    StartRefusal.BACKPRESSURE: WaitReason.BACKPRESSURE,
    StartRefusal.POLICY_LAG: WaitReason.POLICY_LAG,
    StartRefusal.STALE_WEIGHTS: WaitReason.STALE_WEIGHTS,
}


# Refusals a newer snapshot can lift: its later lag deadline fits where the held version's does not.
_NEWER_WEIGHTS_HELP = (WaitReason.STALE_WEIGHTS, WaitReason.POLICY_LAG)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reload:
    actor_id: int
    version: int
    path: str
    """Where the converted snapshot lies (the GU's cache folder of that version)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Start:
    actor_id: int
    assignment: Assignment
    policy_version: int
    """The weights the actor holds, as granted by the CU: its samples carry this version."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Drop:
    assignment: Assignment
    """A revoked queue entry (the CU re-issued it elsewhere); it is gone from the queue."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    actor_id: int
    reason: WaitReason


class EvalJob(Protocol):
    """What the policy reads of an evaluation (``workers.evaluator.EvalJob``; this layer
    imports nothing above it)."""

    @property
    def job_id(self) -> int: ...

    @property
    def min_version(self) -> int:
        """The weights to decode: this snapshot version or a newer one."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluate:
    actor_id: int
    job: EvalJob
    """Decode the job's held-out prompts on this actor (it holds ``job.min_version`` or newer)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalUnavailable:
    job: EvalJob
    reason: str
    """Why no actor of this GU can hold the job's weights (the driver raises it)."""


Action = Reload | Start | Drop | Wait | Evaluate | EvalUnavailable


class StartGate(Protocol):
    """The CU's admission check (``ControlLoop.request_start`` behind whatever transport)."""

    def __call__(self, assignment: Assignment, *, actor_id: int, policy_version: int) -> StartDecision: ...


@dataclass(slots=True, kw_only=True)
class ActorSlot:
    actor_id: int
    version: int
    """Version of the weights the actor holds."""
    running: Assignment | None = None
    """The minibatch it generates; ``None`` while idle or reloading."""
    reloading_to: int | None = None
    """The version it is loading; ``None`` unless a reload is under way."""
    just_loaded: bool = False
    """Reloaded since its last minibatch (one reload per minibatch at most)."""
    rejected_version: int | None = None
    """The last version the actor itself refused to load; never offered to it again."""
    evaluating: EvalJob | None = None
    """The evaluation it decodes; ``None`` unless one is under way."""

    @property
    def idle(self) -> bool:
        return self.running is None and self.reloading_to is None and self.evaluating is None


class GuPolicy:
    def __init__(self, *, gu_id: int, actor_ids: Iterable[int], initial_version: int = 0) -> None:
        self.gu_id = gu_id
        self.queue: deque[Assignment] = deque()
        """Assignments received from the CU and not yet started or dropped, in arrival order."""
        self.slots: dict[int, ActorSlot] = {
            a: ActorSlot(actor_id=a, version=initial_version) for a in sorted(actor_ids)
        }
        self.published: SnapshotInfo | None = None
        """Newest snapshot the CU announced (training layout)."""
        self.converted: SnapshotInfo | None = None
        """Newest snapshot converted for this GU (its ``path`` is the converted copy)."""
        self.converting: SnapshotInfo | None = None
        """The published snapshot under conversion now, if any."""
        self.conversion_rejected: set[int] = set()
        """Versions whose conversion failed (a defective snapshot): never converted again."""
        self._initial_version = initial_version
        self.evals: deque[EvalJob] = deque()
        """Evaluations received and not yet handed to an actor, in arrival order."""

    # ---- input queue -------------------------------------------------------------------------
    def add_assignments(self, assignments: Iterable[Assignment], *, ahead: bool = False) -> None:
        """Queue new work; ``ahead`` puts it before what is queued (it was issued earlier, and the
        driver received it late, e.g. an answer overtaken by a newer one); re-issued work always
        goes before what is queued."""
        new = list(assignments)
        if ahead:
            self.queue.extendleft(reversed(new))
            return
        # A re-issued minibatch (attempt > 0) goes first, as the Database sends it first: its
        # prompts are due, and a poison input then meets its attempt limit instead of spreading
        # failures over the minibatches queued behind it until every restart is spent.
        self.queue.extendleft(reversed([a for a in new if a.attempt > 0]))
        self.queue.extend(a for a in new if a.attempt == 0)

    def clear_queue(self) -> list[Assignment]:
        """Forget every queued assignment (the GU was failed: the CU re-issued them)."""
        dropped = list(self.queue)
        self.queue.clear()
        return dropped

    # ---- conversion ----------------------------------------------------------------------------
    @property
    def converted_version(self) -> int:
        return self._initial_version if self.converted is None else self.converted.version

    def on_snapshot_published(self, snapshot: SnapshotInfo) -> None:
        """The CU announced ``snapshot``; older or repeated announcements are ignored."""
        if self.published is None or snapshot.version > self.published.version:
            self.published = snapshot

    def next_conversion(self) -> SnapshotInfo | None:
        """The snapshot to convert now (marked as converting), or ``None``.

        Only the newest published one: intermediate versions published during a conversion are
        skipped, since actors always reload to the newest converted snapshot anyway.
        """
        target = self.published
        if self.converting is not None or target is None:
            return None
        if target.version <= self.converted_version or target.version in self.conversion_rejected:
            return None
        self.converting = target
        return target

    def on_converted(self, version: int, *, path: str | None) -> None:
        """Conversion of ``version`` ended: ``path`` of the converted copy, ``None`` if it failed."""
        if self.converting is None or self.converting.version != version:
            raise ValueError(
                f"GU {self.gu_id}: conversion of v{version} reported, but "
                f"{'nothing' if self.converting is None else f'v{self.converting.version}'} was converting; "
                "report each conversion that next_conversion() handed out, once."
            )
        converting, self.converting = self.converting, None
        if path is None:
            self.conversion_rejected.add(version)
        elif version > self.converted_version:
            self.converted = SnapshotInfo(version=version, path=path, created_at=converting.created_at)

    # ---- evaluations ---------------------------------------------------------------------------
    def add_eval(self, job: EvalJob) -> None:
        """An evaluation for one of this GU's actors; a job already held is ignored."""
        held = {j.job_id for j in self.evals} | {
            s.evaluating.job_id for s in self.slots.values() if s.evaluating is not None
        }
        if job.job_id not in held:
            self.evals.append(job)

    def on_eval_done(self, actor_id: int) -> EvalJob:
        slot = self._slot(actor_id)
        if slot.evaluating is None:
            raise ValueError(f"GU {self.gu_id} actor {actor_id} finished an evaluation it was never given.")
        job, slot.evaluating = slot.evaluating, None
        return job

    def _eval_actions(self) -> list[Action]:
        actions: list[Action] = []
        while self.evals:
            job = self.evals[0]
            idle = [s for s in self.slots.values() if s.idle]
            ready = [s for s in idle if s.version >= job.min_version]
            if ready:
                self.evals.popleft()
                ready[0].evaluating = job
                actions.append(Evaluate(actor_id=ready[0].actor_id, job=job))
                continue
            if job.min_version in self.conversion_rejected:
                self.evals.popleft()
                actions.append(
                    EvalUnavailable(job=job, reason=f"snapshot v{job.min_version} failed to convert")
                )
                continue
            if any(
                s.reloading_to is not None and s.reloading_to >= job.min_version for s in self.slots.values()
            ):
                break  # an actor is loading its weights already
            target = self.converted
            if target is not None and target.version >= job.min_version:
                # No slot at all is not a refusal: the actors are being replaced, the job waits.
                if self.slots and all(s.rejected_version == target.version for s in self.slots.values()):
                    self.evals.popleft()
                    actions.append(
                        EvalUnavailable(job=job, reason=f"every actor refused snapshot v{target.version}")
                    )
                    continue
                fit = [s for s in idle if target.version != s.rejected_version]
                if fit:
                    actions.append(self._reload(fit[0], target))
            break  # converting, or every actor busy: the job waits; generation goes on
        return actions

    # ---- actors --------------------------------------------------------------------------------
    def next_actions(self, *, paused: bool, request_start: StartGate) -> list[Action]:
        """Decide what every idle actor does now; the returned work is already marked in the slots."""
        actions: list[Action] = self._eval_actions()
        idle = [s for s in self.slots.values() if s.idle]
        for i, slot in enumerate(idle):
            if not self.queue:
                actions.append(Wait(actor_id=slot.actor_id, reason=WaitReason.EMPTY_QUEUE))
                continue
            if paused:
                actions.extend(Wait(actor_id=s.actor_id, reason=WaitReason.PAUSED) for s in idle[i:])
                break
            target = self._reload_target(slot)
            if target is not None and not slot.just_loaded:
                actions.append(self._reload(slot, target))
                continue
            refusal = self._start_head(slot, request_start, actions)
            if refusal is None:
                continue
            if refusal in _NEWER_WEIGHTS_HELP and target is not None:
                actions.append(self._reload(slot, target))
                continue
            if refusal is WaitReason.EMPTY_QUEUE:  # every head was revoked
                actions.append(Wait(actor_id=slot.actor_id, reason=refusal))
                continue
            actions.extend(Wait(actor_id=s.actor_id, reason=refusal) for s in idle[i:])
            break
        return actions

    def _reload_target(self, slot: ActorSlot) -> SnapshotInfo | None:
        target = self.converted
        if target is None or target.version <= slot.version or target.version == slot.rejected_version:
            return None
        return target

    def _reload(self, slot: ActorSlot, target: SnapshotInfo) -> Reload:
        slot.reloading_to = target.version
        return Reload(actor_id=slot.actor_id, version=target.version, path=target.path)

    def _start_head(
        self, slot: ActorSlot, request_start: StartGate, actions: list[Action]
    ) -> WaitReason | None:
        """Start the queue head on ``slot`` (``None``) or say why it must wait."""
        while self.queue:
            head = self.queue[0]
            decision = request_start(head, actor_id=slot.actor_id, policy_version=slot.version)
            if decision.granted:
                self.queue.popleft()
                slot.running, slot.just_loaded = head, False
                actions.append(Start(actor_id=slot.actor_id, assignment=head, policy_version=slot.version))
                return None
            if decision.refusal is StartRefusal.REVOKED:
                actions.append(Drop(assignment=self.queue.popleft()))
                continue
            assert decision.refusal is not None, "a refused start names its reason"
            return _WAIT_FOR_REFUSAL[decision.refusal]
        return WaitReason.EMPTY_QUEUE

    def on_generation_done(self, actor_id: int, *, held_version: int | None = None) -> Assignment:
        """``held_version``: the weights the actor holds now, newer than before when a partial
        rollout reloaded mid-minibatch (it may reload again before its next start)."""
        slot = self._slot(actor_id)
        if slot.running is None:
            raise ValueError(
                f"GU {self.gu_id} actor {actor_id} finished a minibatch it was never started on."
            )
        if held_version is not None and held_version < slot.version:
            raise ValueError(
                f"GU {self.gu_id} actor {actor_id} reports v{held_version} after holding v{slot.version}; "
                "an actor only moves to newer weights"
            )
        finished, slot.running = slot.running, None
        if held_version is not None:
            slot.version = held_version
        return finished

    def on_reloaded(self, actor_id: int, version: int, *, ok: bool) -> None:
        """A reload ended: ``ok`` if the actor now holds ``version``, else it refused that snapshot."""
        slot = self._slot(actor_id)
        if slot.reloading_to != version:
            raise ValueError(
                f"GU {self.gu_id} actor {actor_id}: reload of v{version} reported, but it was "
                f"loading {slot.reloading_to}; report the version the Reload action named."
            )
        slot.reloading_to = None
        if ok:
            slot.version, slot.just_loaded = version, True
        else:
            slot.rejected_version = version

    def add_actor(self, actor_id: int) -> None:
        """A replacement actor is up in a freed slot; it holds the initial weights."""
        if actor_id in self.slots:
            raise ValueError(f"GU {self.gu_id} already has a live actor {actor_id}; replace only a dead one.")
        self.slots[actor_id] = ActorSlot(actor_id=actor_id, version=self._initial_version)
        self.slots = dict(sorted(self.slots.items()))

    def on_actor_died(self, actor_id: int) -> Assignment | None:
        """Forget a dead actor; returns the minibatch it was running (the CU re-issues it). An
        evaluation it was decoding goes back to the head of the evaluations."""
        slot = self.slots.pop(actor_id)
        if slot.evaluating is not None:
            self.evals.appendleft(slot.evaluating)
        return slot.running

    def _slot(self, actor_id: int) -> ActorSlot:
        slot = self.slots.get(actor_id)
        if slot is None:
            raise ValueError(f"GU {self.gu_id} has no live actor {actor_id}; it died or never existed.")
        return slot

    # ---- read-outs -----------------------------------------------------------------------------
    @property
    def all_busy(self) -> bool:
        return all(not s.idle for s in self.slots.values())

    def busy_actor_ids(self) -> list[int]:
        return [a for a, s in self.slots.items() if not s.idle]
