"""Online predictor (feedback, recency-window PAVA refit, per-prompt history) and tail re-plan."""

from __future__ import annotations

import numpy as np
import pytest

from asp_scheduler.online import OnlinePredictor, replan
from asp_scheduler.params import ScheduleParams


def _prompts(n: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    return [f"q{i}" for i in range(n)], rng.lognormal(6.0, 0.5, n)


def test_refit_tracks_a_scale_up_of_unseen_prompts() -> None:
    keys, prior = _prompts(400)
    predictor = OnlinePredictor(dict(zip(keys, prior)), window=128)
    for key, value in zip(keys[:200], prior[:200]):
        predictor.observe(key, 2.0 * value)  # the policy now answers twice as long
    before = predictor.estimates(keys[200:])
    np.testing.assert_allclose(before, prior[200:])  # no refit yet: the offline prediction
    reports = {r.source: r for r in predictor.refit()}
    assert reports["prior"].num_pairs == 128 and reports["prior"].fitted
    assert reports["prior"].kendall_tau == pytest.approx(1.0)
    # MAE and calibration error are out of sample: measured with the map before this refit.
    assert reports["prior"].mae_tokens == pytest.approx(np.mean(prior[72:200]), rel=1e-9)
    assert reports["prior"].calibration_error == pytest.approx(0.5, rel=1e-9)
    assert not reports["history"].fitted
    after = predictor.estimates(keys[200:])
    inside = (prior[200:] > prior[72:200].min()) & (prior[200:] < prior[72:200].max())
    np.testing.assert_allclose(after[inside], 2.0 * prior[200:][inside], rtol=0.15)
    second = {r.source: r for r in predictor.refit()}
    assert second["prior"].calibration_error < 0.05


def test_seen_prompts_use_their_last_observed_length() -> None:
    keys, prior = _prompts(4)
    predictor = OnlinePredictor(dict(zip(keys, prior)), window=8)
    predictor.observe("q1", 999.0)
    est = predictor.estimates(["q0", "q1"])
    assert est[0] == pytest.approx(prior[0]) and est[1] == 999.0
    with pytest.raises(KeyError, match="add_prior"):
        predictor.estimates(["unknown"])
    predictor.add_prior("unknown", 5.0)
    assert predictor.estimates(["unknown"])[0] == 5.0
    with pytest.raises(ValueError, match="recency window"):
        OnlinePredictor({}, window=2)


def test_replan_places_every_item_once_in_homogeneous_minibatches() -> None:
    _, estimates = _prompts(103, seed=3)
    params = ScheduleParams(b=4, kappa=1, k=3, sa_iterations=20_000)
    plan = replan(estimates, params)
    placed = np.sort(np.concatenate(plan.minibatches))
    np.testing.assert_array_equal(placed, np.arange(103))
    sizes = np.array([len(m) for m in plan.minibatches])
    assert np.sum((sizes < 4) | (sizes > 5)) <= 1
    np.testing.assert_array_equal(plan.batch_group_ids, np.arange(len(sizes)) // 3)
    np.testing.assert_allclose(plan.loads, [estimates[m].sum() for m in plan.minibatches])
    assert plan.wall_seconds > 0
