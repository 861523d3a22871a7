"""Hard enforcement of ``max_policy_lag`` (a departure from the paper, which only bounds lag
indirectly through backpressure and reports ``d_off ≈ Q + 3.3``).

Rule. A minibatch started with policy version ``v`` gets the *deadline* step ``v + L``: all of
its prompts must be consumed by then, which is exactly ``d_off <= L``. Trainer steps are slots
holding ``P`` prompts each, so the set of unconsumed prompts is schedulable iff, for every
deadline ``d``, at most ``(d - s + 1) * P`` of them have a deadline ``<= d`` (``s`` = next step).

* Start admission keeps that condition true: a start that would break it is refused
  (``POLICY_LAG``, retry after the next trainer step) and a start whose deadline can never be
  met is refused as ``STALE_WEIGHTS`` (reload a newer snapshot first).
* Consumption takes prompts earliest-deadline-first (the Training Queue's order) and is held back
  when taking them now would leave the condition false for the *next* step, i.e. while a prompt
  whose deadline is due is still being generated. Holding the trainer is the price of a hard
  bound; with a lag of a few steps it is rare because deadlines trail the trainer.

Ordering by arrival alone cannot give a hard bound: minibatches started later can finish first
and push an old one past its deadline, however starts are limited.
"""

from __future__ import annotations

from collections.abc import Iterable

from mindspeed_rl.runtime.records import StartRefusal


class LagBudget:
    def __init__(self, *, max_policy_lag: int | None, prompts_per_step: int) -> None:
        if max_policy_lag is not None and max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be >= 0 or None, got {max_policy_lag}.")
        self.max_policy_lag = max_policy_lag
        self.prompts_per_step = prompts_per_step
        self.next_step = 0
        self._outstanding: dict[int, int] = {}  # deadline -> prompts started but not consumed

    def deadline(self, policy_version: int) -> int | None:
        return None if self.max_policy_lag is None else policy_version + self.max_policy_lag

    def check_start(self, num_prompts: int, policy_version: int) -> StartRefusal | None:
        """``None`` if a minibatch of ``num_prompts`` may start now with ``policy_version``."""
        deadline = self.deadline(policy_version)
        if deadline is None:
            return None
        if num_prompts > self._capacity_through(deadline):
            return StartRefusal.STALE_WEIGHTS
        cum = 0
        for d in sorted(set(self._outstanding) | {deadline}):
            cum += self._outstanding.get(d, 0)
            if d >= deadline and cum + num_prompts > self._capacity_through(d):
                return StartRefusal.POLICY_LAG
        return None

    def reserve(self, num_prompts: int, policy_version: int) -> None:
        deadline = self.deadline(policy_version)
        if deadline is not None:
            self._outstanding[deadline] = self._outstanding.get(deadline, 0) + num_prompts

    def release(self, num_prompts: int, policy_version: int) -> None:
        """Drop the reservation of a started minibatch that failed (it will start again)."""
        self._take(self.deadline(policy_version), num_prompts)

    def can_consume(self, deadlines: Iterable[int | None]) -> bool:
        """Whether a global batch with these prompt deadlines may be consumed at ``next_step``."""
        if self.max_policy_lag is None:
            return True
        after = dict(self._outstanding)
        for d in deadlines:
            assert d is not None and d >= self.next_step, f"prompt with deadline {d} missed it"
            after[d] -= 1
        cum = 0
        for d in sorted(after):
            cum += after[d]
            # After this step, steps next_step+1 .. d remain: (d - next_step) slots.
            if cum > (d - self.next_step) * self.prompts_per_step:
                return False
        return True

    def consume(self, deadlines: Iterable[int | None]) -> None:
        for d in deadlines:
            self._take(d, 1)
        self.next_step += 1

    def _capacity_through(self, deadline: int) -> int:
        """Prompt slots in steps ``next_step .. deadline`` (0 if the deadline is past)."""
        return max(0, deadline - self.next_step + 1) * self.prompts_per_step

    def _take(self, deadline: int | None, num_prompts: int) -> None:
        if deadline is None:
            return
        left = self._outstanding[deadline] - num_prompts
        assert left >= 0, f"released more prompts than reserved for deadline {deadline}"
        if left:
            self._outstanding[deadline] = left
        else:
            del self._outstanding[deadline]
