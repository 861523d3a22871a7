from __future__ import annotations

import pytest
from runtime_fakes import complete, make_schedule

from mindspeed_rl.runtime import Assignment, FakeClock
from mindspeed_rl.runtime.training_queue import TrainingQueue


def _completed(mb_index: int, *, n: int = 2, prompts: tuple[int, int] = (2, 2)):
    mb = make_schedule(mb_index + 1, prompts_per_minibatch=prompts)[mb_index]
    return complete(
        Assignment(gu_id=1, minibatch=mb, attempt=0, issued_at=0.0),
        actor_id=0,
        policy_version=0,
        num_samples_per_prompt=n,
    )


def test_global_batches_hold_whole_prompts_and_record_depth_at_arrivals() -> None:
    clock = FakeClock()
    queue = TrainingQueue(num_prompts_per_global_batch=3, clock=clock)
    first = queue.put(_completed(0), deadline=None)
    clock.advance(1.0)
    second = queue.put(_completed(1), deadline=None)
    assert (first.depth_samples_before, first.depth_samples_after) == (0, 4)
    assert (second.time, second.depth_samples_before, second.depth_global_batches_before) == (1.0, 4, 2 / 3)
    assert queue.depth_prompts == 4 and queue.depth_samples == 8
    batch = queue.pop_global_batch(3, step=0)
    assert batch is not None and batch.prompt_ids == ("p0", "p1", "p2")  # arrival order
    assert all(
        len(g.samples) == 2 and {s.prompt_id for s in g.samples} == {g.prompt_id} for g in batch.prompts
    )
    assert queue.pop_global_batch(3, step=1) is None  # one prompt left: not a full batch
    last = queue.pop_global_batch(3, step=1, allow_partial=True)
    assert last is not None and last.prompt_ids == ("p3",)
    assert queue.depth_samples == 0 and queue.max_depth_samples == 8
    assert [a.minibatch_id for a in queue.arrivals] == [0, 1]


def test_earliest_deadline_first_then_arrival_order() -> None:
    queue = TrainingQueue(num_prompts_per_global_batch=2, clock=FakeClock())
    queue.put(_completed(0), deadline=5)
    queue.put(_completed(1), deadline=3)
    assert [q.group.prompt_id for q in queue.candidates(3)] == ["p2", "p3", "p0"]


def test_a_prompt_cannot_be_queued_twice() -> None:
    queue = TrainingQueue(num_prompts_per_global_batch=2, clock=FakeClock())
    queue.put(_completed(0), deadline=None)
    with pytest.raises(ValueError, match="already queued"):
        queue.put(_completed(0), deadline=None)
    with pytest.raises(ValueError, match="at least one prompt"):
        queue.pop_global_batch(0, step=0)
