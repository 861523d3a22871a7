import numpy as np
import pytest

from asp_scheduler.calibration import IsotonicCalibrator
from asp_scheduler.metrics import load_balance, schedule_metrics
from asp_scheduler.predictors import (
    NoisyOraclePredictor,
    PromptItem,
    evaluate_predictor,
    noisy_oracle_predictions,
)


def test_metrics_on_a_hand_computed_example():
    lengths = np.array([1.0, 3.0, 2.0, 2.0, 4.0, 8.0])
    minibatches = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5])]
    m = schedule_metrics(lengths, minibatches, k=2)
    # STDs: 1, 0, 2 -> D = 1. Padding: 1-2/3, 0, 1-6/8 -> (1/3 + 1/4) / 3.
    assert m.dispersion == pytest.approx(1.0)
    assert m.padding == pytest.approx((1 / 3 + 1 / 4) / 3)
    # Group loads (k = 2): [4 + 4, 12] = [8, 12]: mean 10, STD 2.
    assert m.group_cv == pytest.approx(0.2)
    assert m.group_spread == pytest.approx(1.5)


def test_load_balance_keeps_a_short_last_group():
    cv, spread = load_balance(np.array([1.0, 1.0, 1.0]), k=2)
    assert spread == pytest.approx(2.0)
    assert cv == pytest.approx(1 / 3)


def test_evaluate_predictor_tau_and_mae():
    q = evaluate_predictor(np.array([1.0, 2.0, 3.0, 5.0]), np.array([1.0, 2.0, 4.0, 3.0]))
    assert q.kendall_tau == pytest.approx(4 / 6)
    assert q.mae_tokens == pytest.approx(0.75)
    assert q.num_pairs == 4
    with pytest.raises(ValueError, match="equal length"):
        evaluate_predictor(np.ones(3), np.ones(4))


@pytest.mark.parametrize("tau", [0.0, 0.25, 0.5, 0.64, 0.9, 1.0])
def test_noisy_oracle_hits_its_tau_and_is_deterministic(tau):
    lengths = np.random.default_rng(3).lognormal(8, 0.6, 3000).round() + 1
    first = noisy_oracle_predictions(lengths, tau, seed=7)
    assert abs(evaluate_predictor(first.predictions, lengths).kendall_tau - tau) <= 0.02
    assert np.array_equal(first.predictions, noisy_oracle_predictions(lengths, tau, seed=7).predictions)
    assert np.all(first.predictions > 0)


def test_noisy_oracle_predictor_interface_and_errors():
    prompts = [PromptItem(prompt_id=f"p{i}", text="") for i in range(200)]
    lengths = np.arange(1.0, 201.0)
    oracle = NoisyOraclePredictor(target_tau=0.5, seed=1).fit(prompts, lengths)
    assert oracle.predict(prompts[::-1]).tolist() == oracle.predict(prompts)[::-1].tolist()
    with pytest.raises(ValueError, match="not seen"):
        oracle.predict([PromptItem(prompt_id="unknown", text="")])
    with pytest.raises(ValueError, match="unique"):
        NoisyOraclePredictor().fit([prompts[0], prompts[0]], np.ones(2))
    with pytest.raises(ValueError, match="> 0"):
        noisy_oracle_predictions(np.array([1.0, -2.0, 3.0]), 0.5, 0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        noisy_oracle_predictions(lengths, 1.5, 0)


def test_isotonic_calibration_pools_violators_and_is_monotone():
    cal = IsotonicCalibrator.fit(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 3.0, 2.0, 4.0]))
    # PAV pools the middle pair to 2.5 at x = 2.5.
    assert cal.knots_y.tolist() == [1.0, 2.5, 4.0]
    assert cal.transform(np.array([0.0, 2.5, 10.0])).tolist() == [1.0, 2.5, 4.0]


def test_calibration_reduces_load_error_of_noisy_predictions():
    rng = np.random.default_rng(0)
    true = rng.lognormal(8, 0.5, 4000)
    pred = noisy_oracle_predictions(true, 0.6, 0).predictions
    cal = IsotonicCalibrator.fit(pred[:800], true[:800]).transform(pred[800:])
    assert np.all(np.diff(cal[np.argsort(pred[800:])]) >= 0)
    assert np.mean((cal - true[800:]) ** 2) < 0.7 * np.mean((pred[800:] - true[800:]) ** 2)
