"""Schedule quality metrics (paper App. F.6.2), evaluated on whatever lengths are passed in.

Conventions: STDs are population STDs (ddof = 0). Groups are ``k`` consecutive minibatches
in dispatch order; a shorter last group is kept as is (its load is smaller, which CV and
spread then show honestly rather than hide). A minibatch whose longest length is 0 has no
slots and counts as zero padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleMetrics:
    dispersion: float
    """D: mean over minibatches of the STD of lengths inside the minibatch (tokens)."""
    padding: float
    """P: mean over minibatches of 1 - mean/max."""
    group_cv: float
    """STD / mean of the total tokens per batch group."""
    group_spread: float
    """max / min group load (inf if some group is empty of tokens)."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _segments(lengths: np.ndarray, minibatches: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    if len(minibatches) == 0:
        raise ValueError("a schedule needs at least one minibatch")
    order = np.concatenate([np.asarray(m, dtype=np.int64) for m in minibatches])
    sizes = np.fromiter((len(m) for m in minibatches), dtype=np.int64, count=len(minibatches))
    if np.any(sizes == 0):
        raise ValueError("empty minibatch in schedule; every minibatch needs at least one item")
    return lengths[order], np.concatenate(([0], np.cumsum(sizes)))


def group_loads(minibatch_loads: np.ndarray, k: int) -> np.ndarray:
    """Total load per group of ``k`` consecutive minibatches (last group may be shorter)."""
    num_groups = -(-minibatch_loads.size // k)
    return np.bincount(np.arange(minibatch_loads.size) // k, weights=minibatch_loads, minlength=num_groups)


def load_balance(minibatch_loads: np.ndarray, k: int) -> tuple[float, float]:
    """(CV, spread) of group loads."""
    loads = group_loads(np.asarray(minibatch_loads, dtype=np.float64), k)
    mean = float(loads.mean())
    cv = float(loads.std() / mean) if mean > 0 else 0.0
    low = float(loads.min())
    spread = float(loads.max() / low) if low > 0 else float("inf")
    return cv, spread


def segment_metrics(
    values: np.ndarray, endpoints: np.ndarray, dispatch: np.ndarray, k: int
) -> ScheduleMetrics:
    """Metrics when minibatch m is ``values[endpoints[m]:endpoints[m + 1]]`` and is dispatched at
    position p where ``dispatch[p] == m`` (the scheduler's layout: no gather of 10^7 items)."""
    starts = endpoints[:-1]
    sizes = np.diff(endpoints)
    if np.any(sizes <= 0):
        raise ValueError("empty minibatch in schedule; every minibatch needs at least one item")
    sums = np.add.reduceat(values, starts)
    sq = np.add.reduceat(values * values, starts)
    maxes = np.maximum.reduceat(values, starts)
    means = sums / sizes
    variances = np.maximum(sq / sizes - means * means, 0.0)
    ratio = np.divide(means, maxes, out=np.ones_like(means), where=maxes > 0)
    cv, spread = load_balance(sums[dispatch], k)
    return ScheduleMetrics(
        dispersion=float(np.mean(np.sqrt(variances))),
        padding=float(np.mean(1.0 - ratio)),
        group_cv=cv,
        group_spread=spread,
    )


def schedule_metrics(lengths: np.ndarray, minibatches: Sequence[np.ndarray], k: int) -> ScheduleMetrics:
    """D, P, group CV and spread of ``minibatches`` (index arrays in dispatch order)."""
    values, bounds = _segments(np.asarray(lengths, dtype=np.float64), minibatches)
    return segment_metrics(values, bounds, np.arange(len(minibatches)), k)
