"""Test-only fault injection for the async pipeline: which generation actors exit, hang or raise
at which minibatch, and which GU process exits after how many completions.

Built in ``cli/fault_hooks.py`` from the test hook, carried to each GU in its ``GuSpec``; the
production entry never sets it (an empty plan injects nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

FAULT_KINDS = ("exit", "hang", "raise")


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultPlan:
    """Test-only fault injection: which processes exit, hang or raise, and when (1-based counts)."""

    actor_faults: Mapping[tuple[int, int], Mapping[int, str]] = field(default_factory=dict)
    """(gu_id, actor_id) -> {N: fault}: the actor slot's N-th minibatch (counted across the
    slot's replacements) exits the process, hangs or raises; N = 0 means every minibatch."""
    eval_faults: Mapping[tuple[int, int], Mapping[int, str]] = field(default_factory=dict)
    """(gu_id, actor_id) -> {N: fault}: the slot's N-th evaluation decode (counted across
    replacements) exits the process or hangs."""
    gu_dies: Mapping[int, int] = field(default_factory=dict)
    """gu_id -> the number of forwarded completions after which that GU's process exits (at the
    end of the call that forwarded that many, which may carry more)."""

    def actor_fault(self, gu_id: int, actor_id: int, n: int) -> str | None:
        plan = self.actor_faults.get((gu_id, actor_id), {})
        return plan.get(n, plan.get(0))

    def eval_fault(self, gu_id: int, actor_id: int, n: int) -> str | None:
        return self.eval_faults.get((gu_id, actor_id), {}).get(n)
