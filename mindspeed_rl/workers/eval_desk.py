"""The evaluations the driver handed the Control Unit: which GU decodes each, and the results.

::

    driver ── submit(job) ──► owner = the lowest live GU ──► its outbox ──► GuPoll.eval_jobs
    GU ─────── done(job id, HeldOutDecode | error) ──► results ──► driver's wait_eval
    GU failed ─ reassign(gu) ──► its jobs go to the next live GU (none left: an error result)

An evaluation is one actor's work, so one GU gets it; the rest keep generating. While a job has
no result the run is not over for the GUs (``pending``): the last step's evaluation needs them
after every prompt has been consumed.

Every method but ``wait`` is called with the Control Unit's lock held; ``wait`` takes it through
``ready``, a Condition on that lock that every result (or failure to get one) signals.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mindspeed_rl.workers.evaluator import EvalJob, HeldOutDecode


@dataclass(frozen=True, slots=True)
class EvalOutcome:
    decoded: HeldOutDecode | None
    error: str | None


class EvalDesk:
    def __init__(self, lock: threading.RLock) -> None:
        self.ready = threading.Condition(lock)
        self._owner: dict[int, int] = {}  # job id -> GU, while the job has no result
        self._jobs: dict[int, EvalJob] = {}
        self._outbox: dict[int, list[EvalJob]] = {}
        self._results: dict[int, EvalOutcome] = {}
        self._finished: set[int] = set()

    def submit(self, job: EvalJob, live_gus: Iterable[int]) -> int | None:
        """Give ``job`` to the lowest live GU; returns it (None: no GU left, the job failed)."""
        if job.job_id in self._jobs or job.job_id in self._finished:
            raise ValueError(f"evaluation {job.job_id} was submitted twice; give every evaluation its own id")
        self._jobs[job.job_id] = job
        return self._give(job, sorted(live_gus))

    def _give(self, job: EvalJob, live: list[int]) -> int | None:
        if not live:
            self.done(job.job_id, None, "no Generation Unit is left to decode it")  # signals ready
            return None
        self._owner[job.job_id] = live[0]
        self._outbox.setdefault(live[0], []).append(job)
        return live[0]

    def take(self, gu_id: int) -> tuple[EvalJob, ...]:
        """The jobs ``gu_id`` has not been handed yet (they go out in its next answer)."""
        return tuple(self._outbox.pop(gu_id, ()))

    def has_mail(self, gu_id: int) -> bool:
        return bool(self._outbox.get(gu_id))

    def done(self, job_id: int, decoded: HeldOutDecode | None, error: str | None) -> bool:
        """Record a job's result; False if it already had one (a late duplicate, ignored)."""
        if job_id in self._finished:
            return False
        self._finished.add(job_id)
        self._owner.pop(job_id, None)
        self._jobs.pop(job_id, None)
        self._results[job_id] = EvalOutcome(decoded, error)
        self.ready.notify_all()
        return True

    def reassign(self, failed_gu: int, live_gus: Iterable[int]) -> list[int]:
        """``failed_gu``'s unfinished jobs go to the lowest live GU; returns the GUs that got some."""
        live = sorted(g for g in live_gus if g != failed_gu)
        self._outbox.pop(failed_gu, None)
        moved = [self._jobs[j] for j, g in self._owner.items() if g == failed_gu]
        return [g for job in moved if (g := self._give(job, live)) is not None]

    def wait(
        self, job_id: int, timeout_s: float, fatal: Callable[[], BaseException | None]
    ) -> HeldOutDecode | None:
        """A job's decode, handed out once, blocking up to ``timeout_s`` (None on timeout). Raises
        the GU's reason when it could not decode, and ``fatal()`` once the run cannot go on."""
        deadline = time.monotonic() + timeout_s
        with self.ready:
            while (outcome := self._results.pop(job_id, None)) is None:
                if (failure := fatal()) is not None:
                    raise failure
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.ready.wait(remaining)
        if outcome.decoded is None:
            raise RuntimeError(f"evaluation {job_id} could not be decoded: {outcome.error}")
        return outcome.decoded

    @property
    def pending(self) -> bool:
        """Some job has no result yet."""
        return bool(self._owner)
