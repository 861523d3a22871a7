"""Streaming ASP (``asp_config.window: W``): the schedule covers only the next ``W`` global batches.

::

    prompt source (an iterator, read lazily) ──► PromptWindow.top_up(consumed)
        draws the prompts of the batches the window lacks ──► ASP (predict, DP, SA) on that chunk
        ──► ControlUnit.extend_schedule(minibatches, records, last)   (sent after everything scheduled)

The whole-run schedule (``window: null``) needs every prompt up front; with a window the run
works on a source that is not known ahead (a large dataset read as it goes, prompts produced
during the run) and never holds more than ``W`` global batches of prompts in its schedule. The
window is refilled once half of it has drained (at least one batch), so each chunk the scheduler
balances holds about ``W / 2`` global batches: a larger window gives ASP a larger pool to build
length-homogeneous minibatches from, at the cost of prompts waiting longer to be scheduled.

The source is never read past ``consumed + W`` global batches of prompts. A run that resumes from
a checkpoint skips the prompts its lineage already drew (``drawn_batches``): they are in the
checkpoint's schedule.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.runtime.records import ScheduledMinibatch

logger = logging.getLogger(__name__)

ChunkScheduler = Callable[[Sequence["PromptRecord"]], tuple["ScheduledMinibatch", ...]]
"""The ASP schedule of one chunk of prompts, numbered from 0 (``datasets.asp_schedule``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowChunk:
    minibatches: tuple[ScheduledMinibatch, ...]
    """Numbered after everything scheduled before (ids, batch groups, order)."""
    records: tuple[PromptRecord, ...]
    last: bool
    """The run's prompts are all drawn: the schedule closes with this chunk."""


class PromptWindow:
    def __init__(
        self,
        source: Iterable[PromptRecord],
        *,
        window: int,
        prompts_per_batch: int,
        total_batches: int,
        schedule_chunk: ChunkScheduler,
        drawn_batches: int = 0,
    ) -> None:
        """``total_batches``: the run's global batches (``train_iters``); ``drawn_batches``: how
        many of them a resumed lineage already drew (its checkpoint schedules them)."""
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"asp_config.window must be a number of global batches >= 1, got {window!r}")
        self._source = iter(source)
        self.window = window
        self.refill = max(1, -(-window // 2))
        self.prompts_per_batch = prompts_per_batch
        self.total_batches = total_batches
        self.drawn_batches = drawn_batches
        self.prompts_drawn = drawn_batches * prompts_per_batch
        self._schedule_chunk = schedule_chunk
        self._next = (0, 0, 0)  # minibatch id, batch group id, order index of the next chunk

    def continue_after(self, schedule: Sequence[ScheduledMinibatch]) -> None:
        """Number the next chunks after ``schedule`` (a resumed run's remaining schedule)."""
        if schedule:
            self._next = (
                max(mb.minibatch_id for mb in schedule) + 1,
                max(mb.batch_group_id for mb in schedule) + 1,
                max(mb.order_index for mb in schedule) + 1,
            )

    @property
    def closed(self) -> bool:
        return self.drawn_batches >= self.total_batches

    def top_up(self, consumed_batches: int) -> WindowChunk | None:
        """The chunk that refills the window once ``consumed_batches`` global batches were
        trained, or ``None`` while at most half of it has drained (or everything is drawn)."""
        target = min(self.total_batches, consumed_batches + self.window)
        missing = target - self.drawn_batches
        if missing <= 0 or (missing < self.refill and target < self.total_batches):
            return None
        records = self._draw(missing * self.prompts_per_batch)
        minibatches = self._numbered(self._schedule_chunk(records))
        self.drawn_batches = target
        return WindowChunk(minibatches=minibatches, records=records, last=self.closed)

    def _draw(self, count: int) -> tuple[PromptRecord, ...]:
        drawn: list[PromptRecord] = []
        for record in self._source:
            drawn.append(record)
            if len(drawn) == count:
                break
        self.prompts_drawn += len(drawn)
        if len(drawn) < count:
            needed = self.total_batches * self.prompts_per_batch
            raise ValueError(
                f"the prompt source ended after {self.prompts_drawn} prompts, but the run trains "
                f"{self.total_batches} global batches of {self.prompts_per_batch} prompts ({needed}); "
                "add prompts or lower megatron_training.train_iters"
            )
        return tuple(drawn)

    def _numbered(self, chunk: Sequence[ScheduledMinibatch]) -> tuple[ScheduledMinibatch, ...]:
        # Distinct from every earlier chunk, so a lineage's drawn schedule never repeats an id;
        # the Control Unit renumbers again after its own (re-planned) schedule.
        from mindspeed_rl.runtime.database import renumbered

        first_id, first_group, first_order = self._next
        out = renumbered(chunk, first_id=first_id, first_group=first_group, first_order=first_order)
        num_groups = len({mb.batch_group_id for mb in out})
        self._next = (first_id + len(out), first_group + num_groups, first_order + len(out))
        return out


def skip_drawn(
    source: Iterable[PromptRecord], drawn: Collection[str]
) -> tuple[dict[str, PromptRecord], Iterator[PromptRecord]]:
    """The ``len(drawn)`` prompts a resumed lineage drew (its checkpoint's schedule), by id, and
    ``source`` past them; refuses a source whose first prompts are not exactly those."""
    it = iter(source)
    head = {r.prompt_id: r for _, r in zip(range(len(drawn)), it)}
    if len(head) < len(drawn) or set(head) != set(drawn):
        other = sorted(set(head) ^ set(drawn))
        raise ValueError(
            f"resuming a streaming run: the source's first {len(drawn)} prompts are not the ones the "
            f"checkpoint drew ({len(head)} read; differing ids e.g. {other[:3]}); resume with the same "
            "megatron_training.data_path and seed"
        )
    return head, it
