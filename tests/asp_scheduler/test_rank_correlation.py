"""Kendall's tau-b without scipy: the same statistic as scipy's ``kendalltau`` (variant b) on
inputs with and without ties, and NaN where scipy gives NaN."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import kendalltau

from asp_scheduler.rank_correlation import kendall_tau_b


def _cases() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    cases = []
    for n in (2, 3, 17, 256, 1001):
        x = rng.standard_normal(n)
        cases.append((x, x + rng.standard_normal(n)))  # no ties
        cases.append((x, -x))  # perfectly discordant
        cases.append((rng.integers(0, 4, n).astype(float), rng.integers(0, 3, n).astype(float)))  # many ties
        lengths = np.round(np.exp(rng.normal(5, 1, n)))  # token counts: ties among short answers
        cases.append((lengths, lengths * np.exp(0.8 * rng.standard_normal(n))))
    return cases


@pytest.mark.parametrize("index", range(len(_cases())))
def test_tau_b_is_scipys(index: int) -> None:
    x, y = _cases()[index]
    expected = float(kendalltau(x, y).statistic)
    assert kendall_tau_b(x, y) == pytest.approx(expected, abs=1e-12)
    assert kendall_tau_b(y, x) == pytest.approx(expected, abs=1e-12)


def test_a_constant_input_or_a_single_item_has_no_tau() -> None:
    assert np.isnan(kendall_tau_b(np.ones(5), np.arange(5.0)))
    assert np.isnan(kendalltau(np.ones(5), np.arange(5.0)).statistic)
    assert np.isnan(kendall_tau_b(np.array([1.0]), np.array([2.0])))


def test_a_nan_gives_nan_as_scipy_does() -> None:
    x, y = np.array([1.0, 2.0, np.nan, 4.0]), np.array([1.0, 3.0, 2.0, 4.0])
    assert np.isnan(kendalltau(x, y).statistic)
    assert np.isnan(kendall_tau_b(x, y)) and np.isnan(kendall_tau_b(y, x))


def test_arrays_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="one length"):
        kendall_tau_b(np.arange(3.0), np.arange(4.0))
