"""Calibrating a timing profile from a replay run's plan, event log and metrics (hand-built logs)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mindspeed_rl.runtime.events import (
    Event,
    EventLog,
    MinibatchReceived,
    SnapshotConverted,
    SnapshotPublished,
    WeightsLoaded,
)
from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.sim.calibrate import calibrate_events, calibrate_run_dirs, minibatch_decode_runs
from mindspeed_rl.sim.fit import DecodeRun, fit_decode
from mindspeed_rl.sim.replay import ReplayPlan, plan_dispatch_order, read_plan_lengths, write_plan

A, B, C = 0.01, 0.002, 0.3  # seconds per step, per token, per minibatch

LENGTHS = {
    0: np.array([10, 20, 30, 40]),
    1: np.array([5, 5, 6, 80]),
    2: np.array([50, 50, 50, 50, 50, 50]),
    3: np.array([1, 2, 3]),
}


def _seconds(row: np.ndarray) -> float:
    return C + A * float(row.max()) + B * float(row.sum())


def _events() -> list[Event]:
    events: list[Event] = []
    for mb, row in LENGTHS.items():
        kw = {"time": float(mb), "minibatch_id": mb, "gu_id": 0, "actor_id": 0, "num_samples": row.size}
        events.append(MinibatchReceived(outcome="accepted", generation_seconds=_seconds(row), **kw))
    # A duplicate reply of minibatch 1 with a different time must not enter the fit.
    events.append(MinibatchReceived(time=9.0, minibatch_id=1, gu_id=0, actor_id=1, outcome="duplicate",
                                    num_samples=4, generation_seconds=99.0))  # fmt: skip
    for v, save in ((1, 0.2), (2, 0.4), (3, 0.3)):
        events.append(SnapshotPublished(time=float(v), version=v, path=f"s/{v}", save_seconds=save))
        events.append(SnapshotConverted(time=float(v), gu_id=0, version=v, seconds=0.05 * v))
        events.append(
            WeightsLoaded(time=float(v), gu_id=0, actor_id=0, version=v, seconds=0.1, newest_published=v)
        )
    return events


METRICS = [
    {"iteration_time_s": 3.0, "time/trainer_wait_s": 1.4},
    {"iteration_time_s": 1.7, "time/trainer_wait_s": 0.0},
    {"iteration_time_s": 9.0, "time/trainer_wait_s": 7.2},
]


def test_minibatch_runs_carry_longest_and_total_length() -> None:
    runs = minibatch_decode_runs(_events(), LENGTHS)
    assert [(r.batch_size, r.num_steps, r.tokens) for r in runs] == [
        (4, 40, 100),
        (4, 80, 96),
        (6, 50, 300),
        (3, 3, 6),
    ]


def test_calibration_recovers_the_generating_profile() -> None:
    cal = calibrate_events(_events(), LENGTHS, METRICS, source="hand")
    d = cal.profile.decode
    assert (d.per_step_seconds, d.per_token_seconds, d.per_minibatch_seconds) == pytest.approx(
        (A, B, C), rel=1e-6
    )
    assert cal.profile.train.per_step_seconds == pytest.approx(1.7)  # median of 1.6, 1.7, 1.8
    w = cal.profile.weight_flow
    assert (w.save_seconds, w.convert_seconds, w.load_seconds) == pytest.approx((0.3, 0.1, 0.1))
    assert (cal.num_train_steps, cal.num_snapshots, cal.num_reloads) == (3, 3, 3)
    assert "per_token_seconds: 0.002" in cal.profile_yaml()


def test_stages_a_run_never_exercised_are_zero_and_named() -> None:
    decode_only = [e for e in _events() if isinstance(e, MinibatchReceived)]
    cal = calibrate_events(decode_only, LENGTHS, METRICS, source="short run")
    assert cal.profile.weight_flow.delay_seconds == 0.0
    assert cal.unmeasured == ("save_seconds", "convert_seconds", "load_seconds")
    assert calibrate_events(_events(), LENGTHS, METRICS, source="hand").unmeasured == ()


def test_mismatched_plan_is_an_error() -> None:
    with pytest.raises(ValueError, match="not in the plan"):
        minibatch_decode_runs(_events(), {0: LENGTHS[0]})
    with pytest.raises(ValueError, match="does not belong"):
        minibatch_decode_runs(_events(), {**LENGTHS, 2: np.array([1, 2])})


def test_sum_tokens_outside_its_bounds_is_rejected() -> None:
    with pytest.raises(ValueError, match="sum_tokens"):
        DecodeRun(batch_size=2, num_steps=10, seconds=1.0, sum_tokens=25)
    # Unequal lengths at one batch size still separate a, b, c when L_max and sum vary independently.
    runs = minibatch_decode_runs(_events(), LENGTHS)
    assert fit_decode(runs).r2 == pytest.approx(1.0)


def test_run_dir_round_trip(tmp_path: Path) -> None:
    schedule = tuple(
        ScheduledMinibatch(
            minibatch_id=i, prompt_ids=(f"p{i}",), batch_group_id=i // 2, predicted_load=1.0, order_index=i
        )  # fmt: skip
        for i in LENGTHS
    )
    forced = {f"p{i}": tuple(int(x) for x in row) for i, row in LENGTHS.items()}
    plan = ReplayPlan(condition="C0", prompts=(), schedule=schedule, forced_lengths=forced, step_seconds=1.0)
    write_plan(plan, tmp_path)
    assert plan_dispatch_order(tmp_path) == [("p0",), ("p1",), ("p2",), ("p3",)]
    assert {k: v.tolist() for k, v in read_plan_lengths(tmp_path).items()} == {
        k: v.tolist() for k, v in LENGTHS.items()
    }
    (tmp_path / "events.jsonl").write_text(
        "".join(json.dumps(EventLog.to_json_dict(e)) + "\n" for e in _events())
    )
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in METRICS))
    cal = calibrate_run_dirs([tmp_path])
    assert cal.profile.decode.per_token_seconds == pytest.approx(B, rel=1e-6)
    pooled = calibrate_run_dirs([tmp_path, tmp_path])  # two runs: twice the rows, same profile
    assert pooled.decode_fit.num_runs == 2 * len(LENGTHS) and pooled.num_train_steps == 2 * len(METRICS)
    assert pooled.profile.train == cal.profile.train and pooled.profile.weight_flow == cal.profile.weight_flow
    d, p = cal.profile.decode, pooled.profile.decode
    assert (p.per_step_seconds, p.per_token_seconds) == pytest.approx(
        (d.per_step_seconds, d.per_token_seconds)
    )
    with pytest.raises(ValueError, match="metrics.jsonl"):
        calibrate_run_dirs([tmp_path / "missing"])
