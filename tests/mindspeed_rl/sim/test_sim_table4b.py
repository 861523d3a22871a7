"""Table 4b columns from a hand-written event log (the code shared by simulator and replay)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mindspeed_rl.runtime.events import GlobalBatchPopped, MinibatchReceived, TrainStepDone
from mindspeed_rl.sim.table4b import format_table, queue_depth_series, table4b_row


def _arrive(t: float, n: int, outcome: str = "accepted") -> MinibatchReceived:
    return MinibatchReceived(
        time=t, minibatch_id=0, gu_id=0, actor_id=0, outcome=outcome, num_samples=n, generation_seconds=1.0
    )


def _pop(t: float, step: int, n: int) -> GlobalBatchPopped:
    return GlobalBatchPopped(time=t, step=step, num_prompts=1, num_samples=n, d_off_max=0)


def _done(t: float, step: int) -> TrainStepDone:
    return TrainStepDone(time=t, step=step, train_seconds=1.0)


def _log() -> list:
    # Depth: 0 on [100,102), 8 on [102,104), 4 on [104,106), 0 on [106,110); duplicates do not count.
    return [
        _arrive(102.0, 8),
        _arrive(103.0, 8, outcome="duplicate"),
        _pop(104.0, 0, 4),
        _done(105.0, 0),
        _pop(106.0, 1, 4),
        _done(110.0, 1),
    ]


def test_columns_match_hand_computation() -> None:
    row = table4b_row(_log(), condition="C9", start_time=100.0)
    assert row.num_iterations == 2
    assert row.mean_iteration_seconds == pytest.approx((5.0 + 5.0) / 2)
    assert math.isnan(row.iteration_trend_spearman)  # equal times: a rank trend is undefined
    weights, depths = np.array([2.0, 2.0, 2.0, 4.0]), np.array([0.0, 8.0, 4.0, 0.0])
    mean = (weights * depths).sum() / 10.0
    assert row.queue_mean_samples == pytest.approx(mean)
    assert row.queue_std_samples == pytest.approx(np.sqrt((weights * (depths - mean) ** 2).sum() / 10.0))
    assert row.queue_max_samples == 8
    assert "| C9 | 2 | 5.00 |" in format_table([row])


def test_queue_series_and_trend_and_warmup_skip() -> None:
    series = queue_depth_series(_log(), start_time=100.0)
    assert series.times.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert series.depth_samples.tolist() == [0, 8, 4, 0]
    rising = [_done(10.0, 0), _done(13.0, 1), _done(17.0, 2), _done(22.0, 3)]
    # iterations 10, 3, 4, 5: ranks 4,1,2,3 vs 1,2,3,4 -> sum d^2 = 12 -> rho = 1 - 6*12/(4*15) = -0.2
    assert table4b_row(rising, condition="x", start_time=0.0).iteration_trend_spearman == pytest.approx(-0.2)
    assert table4b_row(rising, condition="x", start_time=0.0, skip_first=1).iteration_trend_spearman == 1.0
    with pytest.raises(ValueError, match="skip_first"):
        table4b_row(rising, condition="x", start_time=0.0, skip_first=4)


def test_missing_steps_are_an_error() -> None:
    with pytest.raises(ValueError, match="not 0..N-1"):
        table4b_row([_done(1.0, 0), _done(3.0, 2)], condition="x", start_time=0.0)
