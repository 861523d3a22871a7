import numpy as np
import pytest

from asp_scheduler import ScheduleParams, build_schedule
from asp_scheduler.predictors import PredictorQuality
from asp_scheduler.schedule import Schedule


def _covers_each_item_once(schedule, n):
    return np.array_equal(np.sort(np.concatenate(schedule.minibatches)), np.arange(n))


@pytest.mark.parametrize(
    ("n", "b", "kappa", "k"), [(1000, 32, 2, 6), (50, 32, 2, 6), (97, 8, 0, 4), (33, 32, 2, 6)]
)
def test_every_item_appears_exactly_once(n, b, kappa, k):
    pred = np.random.default_rng(n).lognormal(7, 1, n)
    s = build_schedule(pred, ScheduleParams(b=b, kappa=kappa, k=k, sa_iterations=10_000, seed=1))
    assert _covers_each_item_once(s, n)
    assert s.batch_group_ids.tolist() == [i // k for i in range(len(s.minibatches))]
    assert sum(len(m) < b for m in s.minibatches) == s.num_short_minibatches


def test_schedule_is_deterministic_and_balances_predicted_groups():
    pred = np.random.default_rng(0).lognormal(7, 0.7, 32 * 6 * 16)  # 16 full groups
    a = build_schedule(pred, ScheduleParams(sa_iterations=200_000, seed=3))
    b = build_schedule(pred, ScheduleParams(sa_iterations=200_000, seed=3))
    assert all(np.array_equal(x, y) for x, y in zip(a.minibatches, b.minibatches))
    unordered = build_schedule(pred, ScheduleParams(sa_iterations=0))
    assert a.predicted_metrics.group_cv < 0.2 * unordered.predicted_metrics.group_cv


def test_group_shuffle_keeps_groups_intact():
    pred = np.random.default_rng(1).lognormal(7, 0.7, 32 * 6 * 5)
    plain = build_schedule(pred, ScheduleParams(kappa=0, sa_iterations=50_000))
    shuffled = build_schedule(pred, ScheduleParams(kappa=0, sa_iterations=50_000, shuffle_groups=True))

    def groups(s):
        return sorted(tuple(sorted(np.concatenate(s.minibatches[g * 6 : g * 6 + 6]))) for g in range(5))

    assert groups(plain) == groups(shuffled)
    assert plain.predicted_metrics.group_cv == pytest.approx(shuffled.predicted_metrics.group_cv)


def test_save_load_round_trips_exactly(tmp_path):
    pred = np.random.default_rng(2).lognormal(7, 1, 500) / 3.0
    s = build_schedule(
        pred,
        ScheduleParams(sa_iterations=10_000, calibrate_loads=True),
        calibrated_lengths=pred * 0.9,
        item_ids=[f"q{i}" for i in range(500)],
        predictor={"name": "noisy_oracle", "target_tau": 0.64},
        predictor_quality=PredictorQuality(kendall_tau=0.64, mae_tokens=12.5, num_pairs=500),
    )
    s.save(tmp_path / "s.json")
    loaded = Schedule.load(tmp_path / "s.json")
    assert all(np.array_equal(x, y) for x, y in zip(s.minibatches, loaded.minibatches))
    for name in ("batch_group_ids", "predicted_lengths", "calibrated_lengths"):
        assert np.array_equal(getattr(s, name), getattr(loaded, name))
    for name in ("item_ids", "params", "predicted_metrics", "predictor", "predictor_quality"):
        assert getattr(s, name) == getattr(loaded, name)
    assert loaded.sa_variance_reduction == s.sa_variance_reduction


def test_bad_inputs_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="non-empty"):
        build_schedule(np.array([]))
    with pytest.raises(ValueError, match=">= 0"):
        build_schedule(np.array([1.0, -1.0] * 20))
    with pytest.raises(ValueError, match="k"):
        build_schedule(np.ones(64), ScheduleParams(k=0))
    with pytest.raises(ValueError, match="allow_small"):
        build_schedule(np.ones(10))
    (tmp_path / "x.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not an asp_schedule"):
        Schedule.load(tmp_path / "x.json")
