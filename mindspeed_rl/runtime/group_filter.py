"""DAPO's dynamic sampling inside the pipeline: which prompt groups are kept, what each trainer
step cost in generation, and when the over-sampling reserve is released.

A group whose filter scores (``Sample.filter_score``, set by the generation actor) are all equal
has zero group-normalised advantage on every sample: training on it only dilutes the batch. Such
a group is dropped at the door of the Training Queue, counted, and consumed (it is never
generated again, on a resume neither); its lag reservation is released at once.

Accounting per trainer step: the groups filtered since the previous global batch was popped are
charged to the next one, so ``gen_batches`` of step ``s`` is (kept + filtered) / generation batch.
With the pipeline running ahead this is an attribution, not a per-step generation log: it is
exact in steady state and for the hybrid loop.

Release rule: the schedule carries the base prompts plus a held reserve; the reserve is released
a batch group at a time while the prompts expected to survive filtering (queued kept prompts,
plus in-flight and sendable prompts at the keep rate observed so far) fall short of what the
remaining steps need.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from mindspeed_rl.runtime.database import Database
from mindspeed_rl.runtime.errors import ProtocolError
from mindspeed_rl.runtime.faults import PipelineFailure
from mindspeed_rl.runtime.records import PromptGroup, Sample

KEEP_RATE_FLOOR = 0.05
"""Lowest keep rate the release rule assumes, so a run that filtered everything so far still
releases a finite number of groups per decision."""


def has_spread(samples: Sequence[Sample]) -> bool:
    """True when the group's filter scores are not all equal (the group carries a GRPO signal)."""
    scores = [s.filter_score for s in samples if s.filter_score is not None]
    if len(scores) != len(samples):
        missing = next(s for s in samples if s.filter_score is None)
        raise ProtocolError(
            f"sample {missing.prompt_id}#{missing.sample_index} has no filter_score but dynamic sampling "
            "is on; generation actors must be built with the plan's filter_scorer"
        )
    return max(scores) > min(scores)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFilterStats:
    """What one trainer step's global batch cost (``dapo/*`` in metrics.jsonl)."""

    groups_kept: int
    groups_filtered: int
    filtered_prompt_ids: tuple[str, ...]
    gen_batches: int


@dataclass(slots=True, kw_only=True)
class GroupFilter:
    generation_batch_prompts: int
    max_prompts_per_step: int | None
    """``filter_groups_max_batches`` x generation batch; None = no limit."""
    kept_total: int = 0
    filtered_total: int = 0
    _filtered_since_pop: list[str] = field(default_factory=list)

    def split(self, groups: Sequence[PromptGroup]) -> tuple[list[PromptGroup], list[PromptGroup]]:
        """(kept, filtered) groups of one completed minibatch; counted."""
        kept = [g for g in groups if has_spread(g.samples)]
        kept_ids = {g.prompt_id for g in kept}
        filtered = [g for g in groups if g.prompt_id not in kept_ids]
        self.kept_total += len(kept)
        self.filtered_total += len(filtered)
        self._filtered_since_pop.extend(g.prompt_id for g in filtered)
        return kept, filtered

    @property
    def keep_rate(self) -> float:
        seen = self.kept_total + self.filtered_total
        return 1.0 if seen == 0 else max(KEEP_RATE_FLOOR, self.kept_total / seen)

    def on_pop(self, num_kept: int) -> StepFilterStats:
        """The step that just took ``num_kept`` kept prompts is charged the filtered ones since the
        last pop. ``ProtocolError`` is not raised here for the max-batches rule: see ``over_limit``."""
        filtered = tuple(self._filtered_since_pop)
        self._filtered_since_pop.clear()
        total = num_kept + len(filtered)
        return StepFilterStats(
            groups_kept=num_kept,
            groups_filtered=len(filtered),
            filtered_prompt_ids=filtered,
            gen_batches=max(1, math.ceil(total / self.generation_batch_prompts)),
        )

    def over_limit(self, num_kept_queued: int, needed: int) -> str | None:
        """Why the next step can no longer stay within ``filter_groups_max_batches``, or None."""
        if self.max_prompts_per_step is None:
            return None
        spent = len(self._filtered_since_pop) + min(num_kept_queued, needed)
        if num_kept_queued < needed and spent >= self.max_prompts_per_step:
            return (
                f"dynamic sampling: the next trainer step has used {spent} generated prompts "
                f"({len(self._filtered_since_pop)} filtered) and holds {num_kept_queued} of the {needed} kept "
                f"groups it needs; rl_config.filter_groups_max_batches allows "
                f"{self.max_prompts_per_step // self.generation_batch_prompts} generation batches of "
                f"{self.generation_batch_prompts}. Raise filter_groups_max_batches (or -1 for no limit), or "
                "use a filter metric / data where fewer groups are uniform"
            )
        return None

    def prompts_to_release(self, *, kept_queued: int, unconsumed_live: int, needed: int) -> int:
        """How many reserve prompts to release so the expected kept supply meets ``needed``.

        ``unconsumed_live``: prompts sent or sendable but not yet ingested (they will be filtered
        at the keep rate)."""
        expected = kept_queued + self.keep_rate * unconsumed_live
        short = needed - expected
        return 0 if short <= 0 else math.ceil(short / self.keep_rate)


class DynamicSampling:
    """The Control Loop's dynamic-sampling part: what it drops, releases and refuses.

    ``steps_total``: the trainer steps this run pops; the held reserve is released against the
    kept prompts they still need."""

    def __init__(self, group_filter: GroupFilter, *, steps_total: int, prompts_per_step: int) -> None:
        self.filter = group_filter
        self.steps_total = steps_total
        self.prompts_per_step = prompts_per_step
        self.prompts_filtered = 0
        self.prompts_oversampled = 0
        self.failure: PipelineFailure | None = None

    def release_reserve(self, db: Database, next_step: int, kept_queued: int) -> None:
        """Send held reserve groups while the kept prompts expected from what is queued, in
        flight and sendable fall short of what the remaining steps need."""
        if not db.num_held_prompts:
            return
        needed = (self.steps_total - next_step) * self.prompts_per_step
        short = self.filter.prompts_to_release(
            kept_queued=kept_queued, unconsumed_live=db.num_live_prompts(), needed=needed
        )
        while short > 0:
            released = db.release_held()
            if not released:
                break
            count = sum(mb.num_prompts for mb in released)
            short -= count
            self.prompts_oversampled += count

    def on_dropped(self, num_filtered: int, *, kept_queued: int) -> None:
        """``num_filtered`` groups of a completion were dropped (already consumed by the caller)."""
        self.prompts_filtered += num_filtered
        why = self.filter.over_limit(kept_queued, self.prompts_per_step)
        if why is not None and self.failure is None:
            self.failure = PipelineFailure(why)

    def on_exhausted(self, step: int, kept_queued: int) -> None:
        """Every prompt, reserve included, is generated and too few groups survived for ``step``."""
        if self.failure is None:
            self.failure = PipelineFailure(
                f"dynamic sampling ran out of prompts: step {step} holds {kept_queued} of the "
                f"{self.prompts_per_step} kept groups it needs after {self.prompts_filtered} groups were "
                f"filtered and the whole over-sampling reserve ({self.prompts_oversampled} prompts) was "
                "generated; the reserve holds filter_groups_max_batches - 1 times the run's prompts (7 "
                "times with -1): raise rl_config.filter_groups_max_batches, add data, or filter on a "
                "metric fewer groups agree on"
            )

    def summary(self) -> dict[str, int]:
        return {
            "groups_filtered_total": self.prompts_filtered,
            "groups_kept_total": self.filter.kept_total,
            "prompts_oversampled_total": self.prompts_oversampled,
        }
