"""DAPO's dynamic sampling inside the async pipeline, on the fake (discrete-event) pipeline:
groups without filter-score spread never reach the trainer, every prompt is consumed once (kept or
filtered), the held reserve is released only as filtering requires, the lag bound holds, and a run
that cannot fill its batches stops naming the key."""

from __future__ import annotations

import dataclasses
import random

import pytest
from runtime_fake_pipeline import FakePipeline, Setup
from runtime_fakes import make_config, make_schedule

from mindspeed_rl.runtime.database import Database, MinibatchState
from mindspeed_rl.runtime.errors import ProtocolError
from mindspeed_rl.runtime.group_filter import GroupFilter, has_spread
from mindspeed_rl.runtime.records import PromptGroup, Sample, ScheduledMinibatch

P = 4  # prompts per global batch (make_config)


def _with_reserve(base: int, reserve: int, seed: int = 0) -> list[ScheduledMinibatch]:
    """``base`` minibatches then ``reserve`` held ones (ids, groups, positions numbered after)."""
    schedule = make_schedule(base + reserve, prompts_per_minibatch=(2, 2), group_size=2, seed=seed)
    return [dataclasses.replace(mb, reserve=i >= base) for i, mb in enumerate(schedule)]


def _run(schedule: list[ScheduledMinibatch], uniform: set[str], steps: int, **setup: object) -> FakePipeline:
    pipe = FakePipeline(
        make_config(max_policy_lag=2),
        schedule,
        Setup(steps_total=steps, uniform_prompts=frozenset(uniform), **setup),  # type: ignore[arg-type]
    )
    pipe.run()
    return pipe


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_filtered_groups_are_consumed_once_and_never_trained(seed: int) -> None:
    schedule = _with_reserve(base=12, reserve=12, seed=seed)  # 24 base prompts = 6 steps of 4
    prompts = [p for mb in schedule for p in mb.prompt_ids]
    uniform = set(random.Random(seed).sample(prompts, k=len(prompts) // 4))
    pipe = _run(schedule, uniform, steps=6, seed=seed)
    loop, batches = pipe.loop, pipe.obs.batches

    assert len(batches) == 6 and all(b.num_prompts == P for b in batches)
    trained = [p for b in batches for p in b.prompt_ids]
    filtered = [p for b in batches for p in b.filtered_prompt_ids]
    assert not set(trained) & uniform  # nothing without spread reaches the trainer
    assert set(filtered) <= uniform
    consumed = trained + filtered
    assert len(consumed) == len(set(consumed))  # exactly once, kept or filtered
    assert loop.sampling.prompts_filtered >= len(filtered) > 0
    # The base alone cannot hold 24 kept prompts once a quarter is filtered: the reserve was used.
    assert loop.sampling.prompts_oversampled > 0
    assert loop.database.num_held_prompts < 24
    for b in batches:  # the lag bound: every trained sample is at most max_policy_lag versions old
        assert all(b.step - s.policy_version <= 2 for s in b.samples)
    assert sum(b.gen_batches for b in batches) >= len(consumed) / P
    loop.check_invariants()


def test_without_filtering_the_reserve_stays_held() -> None:
    schedule = _with_reserve(base=12, reserve=12)
    pipe = _run(schedule, set(), steps=6)
    assert pipe.loop.sampling.prompts_oversampled == 0 and pipe.loop.sampling.prompts_filtered == 0
    assert pipe.loop.database.num_held_prompts == 24
    assert all(not b.filtered_prompt_ids and b.gen_batches == 1 for b in pipe.obs.batches)


def test_a_run_that_filters_too_much_stops_naming_the_key() -> None:
    schedule = _with_reserve(base=6, reserve=2)
    prompts = [p for mb in schedule for p in mb.prompt_ids]
    pipe = _run(schedule, set(prompts[: len(prompts) * 3 // 4]), steps=3)
    failure = pipe.loop.fatal
    assert failure is not None and "dynamic sampling ran out of prompts" in str(failure)
    assert "filter_groups_max_batches" in str(failure)


def test_filter_groups_max_batches_bounds_one_step() -> None:
    schedule = _with_reserve(base=6, reserve=6)
    first_two_groups = {p for mb in schedule[:4] for p in mb.prompt_ids}  # 8 prompts = 2 batches
    pipe = _run(schedule, first_two_groups, steps=3, max_batches=1)
    failure = pipe.loop.fatal
    assert failure is not None and "filter_groups_max_batches allows 1 generation batches" in str(failure)


def _sample(pid: str, i: int, score: float | None) -> Sample:
    return Sample(
        prompt_id=pid, sample_index=i, minibatch_id=0, response_token_ids=(1,), rollout_log_probs=(-0.1,),
        reward=None, policy_version=0, gu_id=0, actor_id=0, sent_at=0.0, filter_score=score,
    )  # fmt: skip


def test_spread_rule_and_missing_scores() -> None:
    assert not has_spread([_sample("a", i, 1.0) for i in range(4)])
    assert has_spread([_sample("a", i, float(i == 3)) for i in range(4)])
    with pytest.raises(ProtocolError, match="filter_scorer"):
        has_spread([_sample("a", 0, None), _sample("a", 1, 1.0)])


def test_release_rule_counts_the_expected_survivors() -> None:
    gf = GroupFilter(generation_batch_prompts=4, max_prompts_per_step=None)
    assert gf.prompts_to_release(kept_queued=0, unconsumed_live=8, needed=8) == 0  # keep rate 1 so far
    gf.split([PromptGroup(prompt_id=p, minibatch_id=0, samples=(_sample(p, 0, 1.0), _sample(p, 1, v)))
              for p, v in (("a", 1.0), ("b", 0.0), ("c", 1.0), ("d", 0.0))])  # fmt: skip
    assert gf.keep_rate == 0.5
    # 8 live prompts are expected to give 4 kept; 2 queued: 2 short at rate 1/2 -> release 4.
    assert gf.prompts_to_release(kept_queued=2, unconsumed_live=8, needed=8) == 4


def test_held_minibatches_leave_the_database_a_group_at_a_time() -> None:
    db = Database(_with_reserve(base=2, reserve=4))
    assert db.num_held_prompts == 8 and db.state(2) is MinibatchState.HELD
    released = db.release_held()
    assert [mb.minibatch_id for mb in released] == [2, 3]  # one batch group (group_size=2)
    assert db.state(2) is MinibatchState.PENDING and db.num_held_prompts == 4
    db.check_invariants()


def test_a_resumed_run_consumes_every_prompt_once_filtered_ones_included() -> None:
    from mindspeed_rl.trainer.checkpointing import remaining_schedule, schedule_from_json, schedule_to_json

    schedule = _with_reserve(base=12, reserve=12, seed=5)
    prompts = [p for mb in schedule for p in mb.prompt_ids]
    uniform = set(random.Random(5).sample(prompts, k=len(prompts) // 3))
    first = _run(schedule, uniform, steps=3, seed=5)  # "killed" after 3 of 6 steps
    lineage = [p for b in first.obs.batches for p in b.consumed_prompt_ids]
    # What a checkpoint carries: the schedule (reserve flags included) and the consumed prompts.
    saved = schedule_from_json(schedule_to_json(schedule))
    left = list(remaining_schedule(saved, lineage))
    assert any(mb.reserve for mb in left)
    second = _run(left, uniform, steps=3, seed=6)
    lineage += [p for b in second.obs.batches for p in b.consumed_prompt_ids]
    assert len(lineage) == len(set(lineage))
    trained = [p for b in (*first.obs.batches, *second.obs.batches) for p in b.prompt_ids]
    assert len(trained) == 6 * P and not set(trained) & uniform
