"""Failed minibatch attempts, poison inputs and stall diagnosis: the no-hang rules, pure Python.

::

    GU: actor raised / timed out / died ──► ControlLoop.on_actor_fault ──► FaultLedger.record
                                                 │  attempts failed < max_attempts: re-queue
                                                 └─ == max_attempts: PoisonedMinibatch (fatal)
    driver waits for a batch, no progress for stall_timeout_s ──► diagnose_stall(StallView)
                                                 └─ StalledPipeline naming the unit and reason

Why a failure budget per minibatch and not only per actor: a prompt that makes every engine
raise (or hang) would otherwise walk from actor to actor and GU to GU, restarting each, and the
run would end as a cascade of dead units with no word about the input. Counting its failed
attempts names the input after ``max_attempts`` tries instead.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class FaultKind(enum.Enum):
    ERROR = "error"
    """The engine raised inside generate (the actor process lives on, possibly broken)."""
    TIMEOUT = "timeout"
    """The minibatch ran past ``minibatch_timeout_s`` (a hung engine)."""
    DIED = "died"
    """The actor process exited."""


class PipelineFailure(RuntimeError):
    """The run cannot go on; the message names the unit or input and what to do about it."""


class PoisonedMinibatch(PipelineFailure):
    """One minibatch failed on every attempt it was given."""


class StalledPipeline(PipelineFailure):
    """No progress for longer than ``stall_timeout_s``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedAttempt:
    minibatch_id: int
    gu_id: int
    actor_id: int
    kind: FaultKind
    detail: str


class FaultLedger:
    """Failed attempts per minibatch and per kind; decides when a minibatch is poison."""

    def __init__(self, *, max_attempts: int) -> None:
        if max_attempts < 1:
            raise ValueError(f"minibatch_max_attempts must be >= 1, got {max_attempts}.")
        self.max_attempts = max_attempts
        self.by_kind: Counter[FaultKind] = Counter()
        self._failed: dict[int, list[FailedAttempt]] = {}

    def record(self, attempt: FailedAttempt, prompt_ids: Sequence[str]) -> PoisonedMinibatch | None:
        """Count one failed attempt; returns the error to raise once the minibatch is poison."""
        self.by_kind[attempt.kind] += 1
        history = self._failed.setdefault(attempt.minibatch_id, [])
        history.append(attempt)
        if len(history) < self.max_attempts:
            return None
        tries = "; ".join(f"GU {a.gu_id} actor {a.actor_id}: {a.kind.value} ({a.detail})" for a in history)
        return PoisonedMinibatch(
            f"minibatch {attempt.minibatch_id} failed all {len(history)} attempts "
            f"(async_config.minibatch_max_attempts={self.max_attempts}); its prompts "
            f"{list(prompt_ids)} are likely poison input. Attempts: {tries}. Inspect or remove those "
            "prompts from the dataset, or raise minibatch_max_attempts if the failures were transient."
        )

    def num_failed(self, minibatch_id: int) -> int:
        return len(self._failed.get(minibatch_id, ()))

    def forget(self, minibatch_id: int) -> None:
        """The minibatch completed: its failure history is no longer needed (bounded memory)."""
        self._failed.pop(minibatch_id, None)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningMinibatch:
    minibatch_id: int
    gu_id: int
    actor_id: int
    started_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StallView:
    """What the Control Unit knows when the driver has waited ``idle_seconds`` without progress."""

    idle_seconds: float
    live_gus: Sequence[int]
    running: Sequence[RunningMinibatch]
    num_issued_not_started: int
    """Minibatches sitting in some GU's input queue."""
    num_unsent: int
    """Minibatches not yet issued to any GU (pending or re-queued)."""
    paused: bool
    queue_depth_samples: int
    latest_version: int
    next_step: int
    last_refusal: Mapping[int, str]
    """Per GU, the reason of its latest refused start (``StartRefusal`` value)."""
    now: float


def diagnose_stall(view: StallView, *, stall_timeout_s: float) -> StalledPipeline:
    """Name the stuck unit and the reason, most specific first."""
    head = f"no progress for {view.idle_seconds:.0f} s (async_config.stall_timeout_s={stall_timeout_s:g}): "
    if not view.live_gus:
        return StalledPipeline(head + "no Generation Unit is left; see the GU errors above.")
    stuck = [r for r in view.running if view.now - r.started_at >= stall_timeout_s]
    if stuck:
        where = ", ".join(
            f"GU {r.gu_id} actor {r.actor_id} on minibatch {r.minibatch_id} for "
            f"{view.now - r.started_at:.0f} s"
            for r in stuck
        )
        return StalledPipeline(
            head + f"actors busy past the stall timeout ({where}); a hung engine: set "
            "async_config.minibatch_timeout_s so hung minibatches are re-issued and the actor replaced."
        )
    lagging = sorted(g for g, why in view.last_refusal.items() if why in ("stale_weights", "policy_lag"))
    if lagging and not view.running and view.num_issued_not_started:
        return StalledPipeline(
            head + f"GU(s) {lagging} refused for stale weights (they hold older than the lag bound "
            f"allows, newest snapshot v{view.latest_version}, trainer at step {view.next_step}) and no "
            "newer snapshot reached them; check the snapshot export and the GU conversion logs, or "
            "raise async_config.max_policy_lag."
        )
    if view.paused and not view.running:
        return StalledPipeline(
            head + f"generation is paused by backpressure (queue {view.queue_depth_samples} samples) "
            "but the trainer cannot form a batch from the queue; raise async_config.queue_max_samples."
        )
    if not view.running and not view.num_issued_not_started and view.num_unsent:
        return StalledPipeline(
            head + f"{view.num_unsent} minibatch(es) are not sent to any of GUs {list(view.live_gus)}; "
            "their input queues stay empty (a Sender bug: report it)."
        )
    return StalledPipeline(
        head + f"{len(view.running)} minibatch(es) running, {view.num_issued_not_started} queued at GUs, "
        f"{view.num_unsent} unsent, paused={view.paused}, refusals {dict(view.last_refusal)}."
    )
