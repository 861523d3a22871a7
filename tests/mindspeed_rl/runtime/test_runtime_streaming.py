"""A streaming schedule (``asp_config.window``) through the fake pipeline: the Control Unit's
schedule grows chunk by chunk as the trainer consumes it, and every invariant of a whole-run
schedule still holds: each prompt consumed once, only the run's last batch short, lag bound,
queue bound, faults re-issued. The source is read lazily (never past ``consumed + W`` batches)."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
from runtime_fake_pipeline import FakePipeline, Fault, Setup
from runtime_fakes import make_config

from mindspeed_rl.runtime import ControlLoop, ScheduledMinibatch
from mindspeed_rl.runtime.errors import ProtocolError
from mindspeed_rl.trainer.prompt_window import PromptWindow


@dataclass(frozen=True)
class Rec:
    prompt_id: str


class Source:
    def __init__(self, pipe_steps: list[int], per_batch: int, window: int) -> None:
        self.steps, self.per_batch, self.window, self.read = pipe_steps, per_batch, window, 0

    def __iter__(self) -> Iterator[Rec]:
        while True:
            limit = (self.steps[0] + self.window) * self.per_batch
            assert self.read < limit, f"prompt {self.read} read past the window ({limit})"
            self.read += 1
            yield Rec(f"q{self.read - 1}")


def chunker(seed: int, largest: int) -> object:
    rng = random.Random(seed)

    def schedule(chunk: Sequence[Rec]) -> tuple[ScheduledMinibatch, ...]:
        ids, out, i = [r.prompt_id for r in chunk], [], 0
        rng.shuffle(ids)
        while ids:
            size = min(len(ids), rng.randint(1, largest))
            out.append(
                ScheduledMinibatch(
                    minibatch_id=i,
                    prompt_ids=tuple(ids[:size]),
                    batch_group_id=i // 3,
                    predicted_load=float(size),
                    order_index=i,
                )  # fmt: skip
            )
            ids, i = ids[size:], i + 1
        return tuple(out)

    return schedule


@pytest.mark.parametrize("seed", range(10))
def test_streaming_pipelines_keep_every_invariant(seed: int) -> None:
    rng = random.Random(seed)
    per_batch, n, lag = rng.choice([3, 4]), rng.choice([1, 2]), rng.choice([1, 2, None])
    window, batches = rng.choice([1, 2, 3, 6]), rng.randint(5, 12)
    config = make_config(num_prompts_per_global_batch=per_batch, num_samples_per_prompt=n,
                         queue_max_samples=per_batch * n * 2, queue_resume_samples=per_batch * n,
                         max_policy_lag=lag)  # fmt: skip
    trained = [0]
    source = Source(trained, per_batch, window)
    largest = per_batch if lag is None else min(lag * per_batch, 3)
    w = PromptWindow(source, window=window, prompts_per_batch=per_batch, total_batches=batches,
                     schedule_chunk=chunker(seed, largest))  # type: ignore[arg-type]  # fmt: skip
    setup = Setup(num_generation_units=rng.randint(1, 2), actors_per_gu=rng.randint(1, 2),
                  gen_seconds=(0.5, 4.0), train_seconds=rng.choice([0.5, 2.0]), seed=seed)  # fmt: skip
    if setup.num_generation_units * setup.actors_per_gu > 1:
        setup.faults = [Fault(time=3.0, gu_id=0, actor_id=0, late_delay=rng.choice([None, 1.0]))]
    pipe = FakePipeline(config, [], setup, window=w)
    original = pipe._on_train_done

    def counted(step: object) -> None:
        trained[0] = int(step) + 1  # type: ignore[call-overload]
        original(step)

    pipe._on_train_done = counted  # type: ignore[method-assign]
    obs = pipe.run()
    consumed = [g.prompt_id for b in obs.batches for g in b.prompts]
    assert Counter(consumed) == Counter(f"q{i}" for i in range(batches * per_batch))
    assert [b.num_prompts for b in obs.batches] == [per_batch] * batches  # no short batch mid-run
    assert pipe.loop.is_finished() and not pipe.loop.schedule_open
    assert source.read == batches * per_batch
    if lag is not None:
        assert all(b.step - s.policy_version <= lag for b in obs.batches for s in b.samples)
    assert obs.depth_violations == []
    summary = pipe.loop.summary()
    assert summary.prompts_consumed == summary.prompts_scheduled == batches * per_batch


def test_an_open_schedule_is_not_finished_and_a_closed_one_refuses_more() -> None:
    config = make_config(num_prompts_per_global_batch=2, num_samples_per_prompt=1)
    loop = ControlLoop(config=config, schedule=(), schedule_open=True)
    assert not loop.is_finished() and not loop.gu_signals().finished
    mb = ScheduledMinibatch(minibatch_id=0, prompt_ids=("a", "b"), batch_group_id=0, predicted_load=1.0,
                            order_index=0)  # fmt: skip
    loop.extend_schedule([mb], close=True)
    assert not loop.schedule_open and loop.database.num_prompts == 2
    with pytest.raises(ProtocolError, match="closed"):
        loop.extend_schedule([mb], close=True)
    again = dataclasses.replace(mb, minibatch_id=1, batch_group_id=1, order_index=1)
    with pytest.raises(ValueError, match="more than one minibatch"):
        ControlLoop(config=config, schedule=[mb], schedule_open=True).extend_schedule([again], close=False)


def test_a_chunk_numbered_by_the_window_appends_after_an_online_replan() -> None:
    """An online re-plan renumbers the unsent tail after everything the database saw; the window
    numbers its next chunk after its own last one, which the tail now uses. The database renumbers
    the chunk after the schedule as it stands (the tiny CLI run with window=2 + online died here)."""
    from mindspeed_rl.runtime.replan import TailPlan

    config = make_config(num_prompts_per_global_batch=2, num_samples_per_prompt=1)
    first = [ScheduledMinibatch(minibatch_id=i, prompt_ids=(f"a{i}",), batch_group_id=i, predicted_load=1.0,
                                order_index=i) for i in range(2)]  # fmt: skip
    loop = ControlLoop(config=config, schedule=first, schedule_open=True)

    def planner(prompts: tuple[str, ...]) -> TailPlan:
        n = len(prompts)
        return TailPlan(minibatches=tuple((i,) for i in range(n)), batch_groups=(0,) * n, loads=(1.0,) * n)

    assert loop.replan_unsent(planner).num_prompts == 2
    assert {mb.minibatch_id for mb in loop.database.schedule_now()} == {2, 3}
    chunk = [dataclasses.replace(mb, minibatch_id=2 + i, prompt_ids=(f"b{i}",), batch_group_id=2, order_index=2 + i)
             for i, mb in enumerate(first)]  # fmt: skip
    added = loop.extend_schedule(chunk, close=True)
    assert [mb.prompt_ids for mb in added] == [("b0",), ("b1",)]
    assert [mb.minibatch_id for mb in added] == [4, 5] and len({mb.batch_group_id for mb in added}) == 1
    now = loop.database.schedule_now()
    assert len({mb.batch_group_id for mb in now}) == 2 and [mb.order_index for mb in now] == sorted(
        mb.order_index for mb in now
    )
