"""The Control Unit's records of a streaming schedule's prompts (``asp_config.window``).

With a whole-run schedule every actor and the trainer get the prompt table at start. A streaming
run draws prompts while it runs, so no table is complete: the CU keeps each prompt's record from
the chunk that scheduled it until the trainer step that consumes it, attaches the records to
every assignment it hands a GU (a re-issue after a fault carries them again) and to the global
batch the trainer pops, then forgets them. Memory is bounded by the window, not the dataset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from mindspeed_rl.runtime.records import Assignment, GlobalBatch, ScheduledMinibatch


class PromptBook:
    def __init__(self) -> None:
        self._records: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self._records)

    def add(self, records: Iterable[Any], minibatches: Sequence[ScheduledMinibatch]) -> None:
        """Keep ``records`` (``PromptRecord`` s); every prompt of ``minibatches`` must have one."""
        incoming = {r.prompt_id: r for r in records}
        clash = sorted(set(incoming) & set(self._records))
        if clash:
            raise ValueError(
                f"prompt(s) {clash[:3]} were already drawn into the window; a streaming prompt source "
                "must yield each prompt id once (alias repeated passes, e.g. '<id>@<pass>')"
            )
        missing = sorted({p for mb in minibatches for p in mb.prompt_ids} - set(incoming))
        if missing:
            raise ValueError(f"chunk schedules prompt(s) {missing[:3]} without their records; send both")
        self._records.update(incoming)

    def attach(self, assignment: Assignment) -> Assignment:
        return dataclasses.replace(assignment, records=self._of(assignment.minibatch.prompt_ids))

    def take(self, batch: GlobalBatch) -> GlobalBatch:
        """``batch`` with its trained prompts' records; every consumed prompt is forgotten."""
        attached = dataclasses.replace(batch, records=self._of(batch.prompt_ids))
        for prompt_id in batch.consumed_prompt_ids:
            self._records.pop(prompt_id, None)
        return attached

    def _of(self, prompt_ids: Sequence[str]) -> tuple[Any, ...]:
        missing = [p for p in prompt_ids if p not in self._records]
        if missing:
            raise KeyError(f"no record for prompt(s) {missing[:3]}: consumed already or never drawn")
        return tuple(self._records[p] for p in prompt_ids)
