"""Trace replay under drift: the plan's ids, versioned forced lengths, and the CV read from events."""

from __future__ import annotations

import numpy as np
import pytest

from asp_scheduler.params import ScheduleParams
from mindspeed_rl.datasets.prompt_alias import prompt_of
from mindspeed_rl.runtime import events as ev
from mindspeed_rl.sim.drift import DriftParams
from mindspeed_rl.sim.drift_replay import build_drift_plan, group_cv_from_events, replay_id
from mindspeed_rl.sim.online import block_cv_of
from mindspeed_rl.sim.workload import SyntheticWorkload
from mindspeed_rl.workers.forced_lengths import FixedLengths, LengthPlan, as_length_plan


def _plan(drift: str):
    base = SyntheticWorkload(num_prompts=48, num_samples_per_prompt=3, median_tokens=60).draw(1)
    return base, build_drift_plan(
        base,
        ScheduleParams(b=4, kappa=0, k=2, sa_iterations=500, seed=1),
        drift=drift,
        tau=0.6,
        global_batch=8,
        drift_params=DriftParams(max_tokens=400),
        prompt_tokens=4,
        vocab_size=50,
    )


def test_epoch_two_is_scheduled_as_the_runs_alias_of_a_later_pass() -> None:
    assert replay_id("s5#e0") == "s5" and replay_id("s5#e1") == "s5@1"
    base, plan = _plan("hetero2x")
    ids = [p for mb in plan.schedule for p in mb.prompt_ids]
    assert sorted(ids) == sorted([*base.prompt_ids, *(f"{p}@1" for p in base.prompt_ids)])
    assert sorted({mb.minibatch_id for mb in plan.schedule}) == list(range(len(plan.schedule)))
    # Both draws of a prompt share the prior (the offline prediction) and the online key.
    for p in base.prompt_ids:
        assert plan.predictions[p] == plan.predictions[f"{p}@1"]
        assert prompt_of(f"{p}@1") == p
    assert {r.prompt_id for r in plan.prompts} == set(ids)
    assert plan.lengths.num_steps == 2 * base.num_prompts // 8


def test_forced_lengths_follow_the_weights_that_generate_them() -> None:
    base, plan = _plan("hetero2x")
    lengths = plan.lengths
    assert isinstance(lengths, LengthPlan)
    first = np.array([lengths.lengths(p, 0) for p in base.prompt_ids])
    last = np.array([lengths.lengths(p, lengths.num_steps) for p in base.prompt_ids])
    assert np.array_equal(first, base.lengths)  # version 0: the trace itself
    assert 1.5 < last.mean() / first.mean() < 2.6  # the mean grows about 2x (rounding, the cap)
    ratio = last.mean(axis=1) / first.mean(axis=1)
    assert (ratio < 1).any() and (ratio > 2).any()  # heterogeneous: some shorten, some grow
    assert last.max() <= 400
    with pytest.raises(ValueError, match="not in the replayed trace"):
        lengths.lengths("nope", 0)
    _, flat = _plan("none")
    assert flat.lengths.lengths(base.prompt_ids[0], 17) == tuple(int(x) for x in base.lengths[0])


def test_a_fixed_trace_is_checked_and_ignores_the_version() -> None:
    plan = as_length_plan({"a": [3, 4]}, 2)
    assert isinstance(plan, FixedLengths) and plan.lengths("a", 0) == plan.lengths("a", 9) == (3, 4)
    with pytest.raises(ValueError, match="n_samples_per_prompt=2"):
        as_length_plan({"a": [3]}, 2)
    with pytest.raises(ValueError, match="add it to the replay trace"):
        plan.lengths("b", 0)


def test_group_cv_from_events_uses_issue_order_groups_and_accepted_tokens() -> None:
    tokens = [10, 30, 20, 20, 50, 10, 5, 5]  # minibatches 0..7, groups of 2
    log: list[ev.Event] = []
    for mb in range(8):
        log.append(ev.MinibatchIssued(time=mb, minibatch_id=mb, gu_id=0, attempt=0, batch_group_id=mb // 2))
    # minibatch 3 failed once: the superseded completion's tokens must not count
    log.append(ev.MinibatchReceived(time=9, minibatch_id=3, gu_id=0, actor_id=0, outcome="superseded",
                                    num_samples=4, generation_seconds=1, num_response_tokens=999))  # fmt: skip
    log.append(ev.MinibatchIssued(time=9, minibatch_id=3, gu_id=0, attempt=1, batch_group_id=1))
    for mb, t in enumerate(tokens):
        log.append(ev.MinibatchReceived(time=10 + mb, minibatch_id=mb, gu_id=0, actor_id=0, outcome="accepted",
                                        num_samples=4, generation_seconds=1, num_response_tokens=t))  # fmt: skip
    got = group_cv_from_events(log, k=2, block=8)
    rows = [(mb // 2, mb, float(t), 0.0) for mb, t in enumerate(tokens)]
    assert got == block_cv_of(rows, 2, 8)
    loads = np.array([40.0, 40.0, 60.0, 10.0])
    assert got["measured"] == pytest.approx(loads.std() / loads.mean())
    assert got["num_groups"] == 4
