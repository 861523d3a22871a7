"""Replay plans: forced lengths, synthetic prompts, shared predictions, and the event-log round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from asp_scheduler import ScheduleParams
from mindspeed_rl.runtime.events import Event, EventLog, GlobalBatchPopped, MinibatchReceived, TrainStepDone
from mindspeed_rl.sim.replay import build_replay_plans, forced_lengths, read_events, synthetic_prompts
from mindspeed_rl.sim.table4b import table4b_row
from mindspeed_rl.sim.workload import Workload


def workload(num_prompts: int = 8) -> Workload:
    lengths = np.arange(1, 2 * num_prompts + 1, dtype=np.int64).reshape(num_prompts, 2) * 3
    return Workload(prompt_ids=tuple(f"p{i}" for i in range(num_prompts)), lengths=lengths, source="t")


def test_forced_lengths_clip_and_count() -> None:
    lengths, clipped = forced_lengths(workload(), 20)
    assert lengths["p0"] == (3, 6)
    assert lengths["p3"] == (20, 20)  # 21 and 24 clipped
    assert clipped == sum(int(v > 20) for v in workload().lengths.ravel())
    with pytest.raises(ValueError, match="length limit"):
        forced_lengths(workload(), 0)


def test_synthetic_prompts_fit_vocab_and_differ() -> None:
    prompts = synthetic_prompts(["a", "b", "c"], num_tokens=4, vocab_size=10)
    assert [p.prompt_id for p in prompts] == ["a", "b", "c"]
    assert all(len(p.token_ids) == 4 and all(1 <= t < 10 for t in p.token_ids) for p in prompts)
    assert len({p.token_ids for p in prompts}) == 3


def test_plans_share_prompts_and_lengths_but_not_order() -> None:
    settings = ScheduleParams(b=2, kappa=0, k=2, sa_iterations=500, seed=0)
    plans = build_replay_plans(
        workload(), settings, ["C0", "C1"], tau=0.6, step_seconds=0.5, length_limit=100, prompt_tokens=3,
        vocab_size=50,
    )  # fmt: skip
    c0, c1 = plans.plans["C0"], plans.plans["C1"]
    assert c0.prompts == c1.prompts and c0.forced_lengths == c1.forced_lengths
    assert c0.total_response_tokens == int(workload().lengths.sum())
    order = [[pid for mb in p.schedule for pid in mb.prompt_ids] for p in (c0, c1)]
    assert sorted(order[0]) == sorted(order[1]) == sorted(workload().prompt_ids)
    with pytest.raises(ValueError, match="step_seconds"):
        build_replay_plans(
            workload(),
            settings,
            ["C0"],
            tau=0.6,
            step_seconds=-1,
            length_limit=9,
            prompt_tokens=3,
            vocab_size=50,
        )


def test_event_log_round_trip_gives_the_same_table(tmp_path: Path) -> None:
    events: list[Event] = [
        MinibatchReceived(
            time=0.0,
            minibatch_id=0,
            gu_id=0,
            actor_id=0,
            outcome="accepted",
            num_samples=8,
            generation_seconds=1.0,
        ),
        GlobalBatchPopped(time=1.0, step=0, num_prompts=4, num_samples=8, d_off_max=0),
        TrainStepDone(time=2.0, step=0, train_seconds=1.0),
        TrainStepDone(time=5.0, step=1, train_seconds=1.0),
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(EventLog.to_json_dict(e)) + "\n" for e in events))
    back = read_events(path)
    assert table4b_row(back, condition="x") == table4b_row(events, condition="x")
    path.write_text(json.dumps({"event": "Nope", "time": 0.0}) + "\n")
    with pytest.raises(ValueError, match="unknown event type"):
        read_events(path)
