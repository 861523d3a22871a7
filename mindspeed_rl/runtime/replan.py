"""Online re-plan of the schedule's unsent tail, with the planner injected.

The runtime imports nothing else of the package, so the planner (predictions and the DP + SA
scheduler) is a callable built by the trainer or the simulator: it receives the prompts of one
tail segment and returns their new minibatches and batch groups. This module turns that into
``ScheduledMinibatch`` records numbered after the whole schedule and swaps them in through
:meth:`Database.replace_unsent_tail`, which checks exactly-once and the ordering invariants.
What was issued, is running, completed, or re-queued is never touched.

Segments: a tail may span parts that must not mix (epochs: a prompt's second pass must not
overtake its first). ``segment_of`` names each minibatch's segment; every maximal run of
consecutive minibatches of one segment is re-planned on its own, in the tail's order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mindspeed_rl.runtime.database import Database
from mindspeed_rl.runtime.records import CompletedMinibatch, GlobalBatch, ScheduledMinibatch


@dataclass(frozen=True, slots=True, kw_only=True)
class TailPlan:
    """One segment re-planned: positions into its prompt list, in dispatch order."""

    minibatches: tuple[tuple[int, ...], ...]
    batch_groups: tuple[int, ...]
    """Group of each minibatch (any labels; consecutive equal labels form one group)."""
    loads: tuple[float, ...]
    """Estimated load of each minibatch (tokens), recorded as its ``predicted_load``."""


class TailPlanner(Protocol):
    def __call__(self, prompt_ids: tuple[str, ...]) -> TailPlan: ...


class OnlineHook(Protocol):
    """What the Control Unit calls for online ASP (built by the trainer, handed to the CU)."""

    def on_scheduled(self, schedule: Sequence[ScheduledMinibatch], now: float) -> None:
        """``schedule`` became dispatchable: the whole schedule at start, or a streaming chunk."""

    def observe(self, completed: CompletedMinibatch) -> None:
        """An accepted minibatch: its samples' true lengths."""

    def on_consumed(self, batch: GlobalBatch, now: float) -> None: ...

    def after_step(self, step: int, replan: Callable[[TailPlanner], ReplanOutcome]) -> dict[str, float]:
        """After trainer step ``step``: refit / re-plan as due; returns metrics for the step."""
        ...

    def replan_now(self, replan: Callable[[TailPlanner], ReplanOutcome]) -> ReplanOutcome:
        """Re-plan the unsent tail at once (a streaming chunk just arrived)."""
        ...

    def summary(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplanOutcome:
    num_prompts: int
    """Prompts in the re-planned tail."""
    minibatches_before: int
    minibatches_after: int
    wall_seconds: float
    """Planner calls plus the swap."""

    def as_dict(self) -> dict[str, float | int]:
        return {
            "num_prompts": self.num_prompts,
            "minibatches_before": self.minibatches_before,
            "minibatches_after": self.minibatches_after,
            "wall_seconds": self.wall_seconds,
        }


def replan_unsent(
    database: Database,
    planner: TailPlanner,
    *,
    segment_of: Callable[[ScheduledMinibatch], Hashable] | None = None,
) -> ReplanOutcome:
    """Re-plan ``database``'s unsent tail with ``planner``; the caller holds the loop's lock."""
    start = time.perf_counter()
    tail = database.unsent_tail()
    if not tail:
        return ReplanOutcome(num_prompts=0, minibatches_before=0, minibatches_after=0, wall_seconds=0.0)
    everything = [database.minibatch(i) for i in database.minibatch_ids()]
    next_id = max(mb.minibatch_id for mb in everything) + 1
    next_group = max(mb.batch_group_id for mb in everything) + 1
    next_order = max(mb.order_index for mb in everything) + 1
    new: list[ScheduledMinibatch] = []
    for segment in _segments(tail, segment_of):
        prompts = tuple(p for mb in segment for p in mb.prompt_ids)
        plan = planner(prompts)
        _check_plan(plan, len(prompts))
        labels: dict[int, int] = {}
        for members, group, load in zip(plan.minibatches, plan.batch_groups, plan.loads):
            if group not in labels:
                labels[group] = next_group
                next_group += 1
            new.append(
                ScheduledMinibatch(
                    minibatch_id=next_id,
                    prompt_ids=tuple(prompts[i] for i in members),
                    batch_group_id=labels[group],
                    predicted_load=float(load),
                    order_index=next_order,
                )
            )
            next_id += 1
            next_order += 1
    database.replace_unsent_tail(new)
    return ReplanOutcome(
        num_prompts=sum(mb.num_prompts for mb in tail),
        minibatches_before=len(tail),
        minibatches_after=len(new),
        wall_seconds=time.perf_counter() - start,
    )


def _segments(
    tail: Sequence[ScheduledMinibatch], segment_of: Callable[[ScheduledMinibatch], Hashable] | None
) -> list[list[ScheduledMinibatch]]:
    if segment_of is None:
        return [list(tail)]
    runs: list[list[ScheduledMinibatch]] = []
    last: Hashable = object()
    for mb in tail:
        key = segment_of(mb)
        if not runs or key != last:
            runs.append([])
            last = key
        runs[-1].append(mb)
    return runs


def _check_plan(plan: TailPlan, num_prompts: int) -> None:
    if not len(plan.minibatches) == len(plan.batch_groups) == len(plan.loads):
        raise ValueError(
            f"the tail planner returned {len(plan.minibatches)} minibatches, {len(plan.batch_groups)} "
            f"groups and {len(plan.loads)} loads; give one group and one load per minibatch."
        )
    positions = sorted(i for members in plan.minibatches for i in members)
    if positions != list(range(num_prompts)):
        raise ValueError(
            f"the tail planner must place each of the {num_prompts} prompts exactly once; it placed "
            f"{len(positions)} slots."
        )
