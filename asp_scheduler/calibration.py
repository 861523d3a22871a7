"""Isotonic calibration of predicted lengths (beyond the paper).

A ranker's raw predictions are fine for sorting but biased as loads: with multiplicative noise
the longest *predicted* minibatches are over-predicted and the shortest under-predicted
(regression to the mean), so balancing raw predicted loads over-corrects. Calibration maps a
raw prediction to the expected true length given that prediction, ``E[l | pred]``, fitted by
isotonic (non-decreasing) regression on profiled (prediction, measured length) pairs. Being
monotone it keeps the sort order, so only the SA step's loads change.

Pool-adjacent-violators runs in a numba loop (O(n) after sorting); prediction interpolates
linearly between block centres and clamps outside the fitted range.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np


@numba.njit(cache=True)
def _pav(y: np.ndarray, w: np.ndarray):
    n = y.size
    means = np.empty(n)
    weights = np.empty(n)
    starts = np.empty(n, dtype=np.int64)
    top = 0
    for i in range(n):
        means[top] = y[i]
        weights[top] = w[i]
        starts[top] = i
        top += 1
        while top > 1 and means[top - 2] >= means[top - 1]:
            total = weights[top - 2] + weights[top - 1]
            means[top - 2] = (means[top - 2] * weights[top - 2] + means[top - 1] * weights[top - 1]) / total
            weights[top - 2] = total
            top -= 1
    return means[:top], starts[:top]


@dataclass(frozen=True, slots=True, kw_only=True)
class IsotonicCalibrator:
    """Piecewise-linear non-decreasing map from raw prediction to expected true length."""

    knots_x: np.ndarray
    knots_y: np.ndarray
    num_pairs: int

    @classmethod
    def fit(cls, predicted: np.ndarray, measured: np.ndarray) -> IsotonicCalibrator:
        pred = np.asarray(predicted, dtype=np.float64)
        true = np.asarray(measured, dtype=np.float64)
        if pred.shape != true.shape or pred.ndim != 1 or pred.size < 2:
            raise ValueError(
                f"calibration needs two equal-length 1-D arrays of >= 2 profiled pairs, got shapes "
                f"{pred.shape} and {true.shape}; profile more items"
            )
        if not (np.all(np.isfinite(pred)) and np.all(np.isfinite(true))):
            raise ValueError("calibration pairs must be finite; drop NaN/inf predictions or lengths")
        # Equal predictions must map to one value: pool them first (weights = counts).
        xs, inverse, counts = np.unique(pred, return_inverse=True, return_counts=True)
        sums = np.bincount(inverse, weights=true)
        means, starts = _pav(sums / counts, counts.astype(np.float64))
        ends = np.append(starts[1:], xs.size)
        # Block centre = weighted mean of its x values, so interpolation is unbiased inside a block.
        cum_wx = np.concatenate(([0.0], np.cumsum(xs * counts)))
        cum_w = np.concatenate(([0.0], np.cumsum(counts)))
        centres = (cum_wx[ends] - cum_wx[starts]) / (cum_w[ends] - cum_w[starts])
        return cls(knots_x=centres, knots_y=means, num_pairs=int(pred.size))

    def transform(self, predicted: np.ndarray) -> np.ndarray:
        return np.interp(np.asarray(predicted, dtype=np.float64), self.knots_x, self.knots_y)


def profiled_indices(num_items: int, fraction: float, seed: int) -> np.ndarray:
    """The random ``fraction`` of items treated as profiled (at least 2, as the fit needs them).

    One draw shared by the ablation and the run's oracle predictor, so both calibrate on the
    same subset for the same seed.
    """
    if num_items < 2:
        raise ValueError(f"calibration needs at least 2 items to profile, got {num_items}; add items")
    count = min(max(2, round(fraction * num_items)), num_items)
    return np.random.default_rng([seed, 2]).choice(num_items, size=count, replace=False)
