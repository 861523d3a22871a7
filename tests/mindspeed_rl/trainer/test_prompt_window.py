"""``PromptWindow``: a streaming run's schedule never reaches past ``consumed + W`` global batches,
chunks are numbered after everything before them, and a short or foreign source fails by name."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from mindspeed_rl.runtime import ScheduledMinibatch
from mindspeed_rl.runtime.database import Database
from mindspeed_rl.trainer.prompt_window import PromptWindow, skip_drawn


@dataclass(frozen=True)
class Rec:
    prompt_id: str


class GuardedSource:
    """Yields ``p0, p1, ...``; fails if read past what the window may hold at the current step."""

    def __init__(self, total: int, per_batch: int, window: int) -> None:
        self.total, self.per_batch, self.window = total, per_batch, window
        self.consumed = 0
        self.read = 0

    def __iter__(self) -> Iterator[Rec]:
        while self.read < self.total:
            limit = (self.consumed + self.window) * self.per_batch
            if self.read >= limit:
                raise AssertionError(
                    f"read prompt {self.read} past the window ({limit} at step {self.consumed})"
                )
            self.read += 1
            yield Rec(f"p{self.read - 1}")


def pairs(chunk: Sequence[Rec]) -> tuple[ScheduledMinibatch, ...]:
    """A toy chunk scheduler: minibatches of 2 (numbered from 0), 2 per batch group, reversed order."""
    ids = [r.prompt_id for r in chunk][::-1]
    return tuple(
        ScheduledMinibatch(
            minibatch_id=i,
            prompt_ids=tuple(ids[j : j + 2]),
            batch_group_id=i // 2,
            predicted_load=1.0,
            order_index=i,
        )
        for i, j in enumerate(range(0, len(ids), 2))
    )


@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_window_reads_lazily_and_schedules_every_prompt_once(window: int) -> None:
    per_batch, batches = 4, 9
    source = GuardedSource(total=10_000, per_batch=per_batch, window=window)
    w = PromptWindow(
        source, window=window, prompts_per_batch=per_batch, total_batches=batches, schedule_chunk=pairs
    )
    db = Database(())
    chunks = []
    for consumed in range(batches + 1):
        source.consumed = consumed
        chunk = w.top_up(consumed)
        if chunk is not None:
            db.extend(chunk.minibatches)  # numbering after the whole schedule is checked there
            chunks.append(chunk)
            # Drawn in whole batches, never beyond the window, refilled once half of it drained.
            assert w.drawn_batches == min(batches, consumed + window)
            assert {p for mb in chunk.minibatches for p in mb.prompt_ids} == {
                r.prompt_id for r in chunk.records
            }
        ahead = w.drawn_batches - consumed
        assert ahead >= min(window - w.refill + 1, batches - consumed) or w.closed
    assert [c.last for c in chunks] == [False] * (len(chunks) - 1) + [True]
    scheduled = [p for mb in db.schedule_now() for p in mb.prompt_ids]
    assert sorted(scheduled) == sorted(f"p{i}" for i in range(batches * per_batch))
    assert source.read == batches * per_batch  # nothing past the run's last batch was read
    if window < batches:
        assert len(chunks) > 1


def test_a_short_source_names_the_missing_prompts() -> None:
    w = PromptWindow((Rec(f"p{i}") for i in range(10)), window=2, prompts_per_batch=4, total_batches=5,
                     schedule_chunk=pairs)  # fmt: skip
    assert w.top_up(0) is not None  # 8 prompts; the next batch finds only 2
    with pytest.raises(ValueError, match=r"ended after 10 prompts.*5 global batches of 4 prompts \(20\)"):
        w.top_up(1)


def test_window_must_be_a_positive_count() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="asp_config.window must be a number of global batches"):
            PromptWindow([], window=bad, prompts_per_batch=1, total_batches=1, schedule_chunk=pairs)  # type: ignore[arg-type]


def test_resume_skips_what_the_lineage_drew_and_numbers_after_its_schedule() -> None:
    records = [Rec(f"p{i}") for i in range(12)]
    first = PromptWindow(iter(records), window=2, prompts_per_batch=2, total_batches=6, schedule_chunk=pairs)
    chunk = first.top_up(0)
    assert chunk is not None
    drawn_ids = [p for mb in chunk.minibatches for p in mb.prompt_ids]
    head, rest = skip_drawn(iter(records), drawn_ids)
    assert set(head) == set(drawn_ids)
    resumed = PromptWindow(rest, window=2, prompts_per_batch=2, total_batches=6, schedule_chunk=pairs,
                           drawn_batches=len(drawn_ids) // 2)  # fmt: skip
    resumed.continue_after(chunk.minibatches)
    db = Database(chunk.minibatches)
    more = resumed.top_up(1)
    assert more is not None and more.records[0].prompt_id == "p4"
    db.extend(more.minibatches)
    with pytest.raises(ValueError, match="not the ones the checkpoint drew"):
        skip_drawn(iter(records[1:]), drawn_ids)
