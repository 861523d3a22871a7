"""Algorithm 1: length-homogeneous minibatches by dynamic programming over sorted predictions.

Sizes lie in ``[b, b + kappa]``. The default objective is the paper's: maximise the sum of
utilisations ``R(j, i) = (S[i] - S[j]) / ((i - j) * l[i - 1])``. ``objective="padded_slots"``
is an exact alternative that minimises total padded slots ``sum((i - j) * l[i - 1]) - sum(l)``
(it weights a boundary by the tokens it wastes rather than by a per-minibatch ratio).

Departure (the paper leaves it open): when ``n`` cannot be written as a sum of sizes in
``[b, b + kappa]`` the DP allows exactly ONE shorter minibatch (size in ``[1, b - 1]``), placed
wherever the objective is best (a second DP layer tracks whether it was used). Nothing is
dropped and nothing crashes; :attr:`MinibatchPartition.num_short_minibatches` reports it. The
short one is only used when unavoidable. ``n < b`` is a user error unless ``allow_small=True``
(then the whole input is one short minibatch). Ties keep the first (largest-size) candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numba
import numpy as np

DpObjective = Literal["utilization", "padded_slots"]
_OBJECTIVE_CODES: dict[str, int] = {"utilization": 0, "padded_slots": 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class MinibatchPartition:
    """Endpoints ``0 = x_0 < x_1 < ... < x_NB = n`` over the sorted list."""

    endpoints: np.ndarray
    num_short_minibatches: int
    objective: str
    objective_value: float

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.endpoints)

    @property
    def num_minibatches(self) -> int:
        return int(self.endpoints.size - 1)


def validate_sizes(b: int, kappa: int) -> None:
    if isinstance(b, bool) or not isinstance(b, int | np.integer) or b <= 0:
        raise ValueError(
            f"b (base minibatch size, in prompts) must be a positive integer, got {b!r}; e.g. b=32"
        )
    if isinstance(kappa, bool) or not isinstance(kappa, int | np.integer) or kappa < 0:
        raise ValueError(
            f"kappa (allowed size variation) must be an integer >= 0, got {kappa!r}; e.g. kappa=2"
        )


def is_representable(n: int, b: int, kappa: int) -> bool:
    """Whether ``n`` is a sum of sizes in ``[b, b + kappa]`` (n = 0 is the empty sum)."""
    lowest_count = -(-n // (b + kappa))
    return lowest_count <= n // b


@numba.njit(cache=True, inline="always")
def _score(s: np.ndarray, lengths: np.ndarray, j: int, i: int, code: int) -> float:
    size = i - j
    slots = size * lengths[i - 1]
    if code == 0:
        return (s[i] - s[j]) / slots if slots > 0 else 1.0
    return -(slots - (s[i] - s[j]))


@numba.njit(cache=True)
def _dp_kernel(lengths: np.ndarray, b: int, kappa: int, code: int, use_short: bool):
    n = lengths.size
    s = np.zeros(n + 1)
    for i in range(n):
        s[i + 1] = s[i] + lengths[i]
    dp0 = np.full(n + 1, -np.inf)
    prev0 = np.full(n + 1, -1, dtype=np.int64)
    dp0[0] = 0.0
    layers = 2 if use_short else 1
    dp1 = np.full(n + 1 if use_short else 1, -np.inf)
    prev1 = np.full(n + 1 if use_short else 1, -1, dtype=np.int64)
    # prev1 < 0 encodes "came from layer 0": stored as -(j + 2).
    for i in range(1, n + 1):
        for j in range(max(0, i - (b + kappa)), i - b + 1):
            if dp0[j] > -np.inf:
                v = dp0[j] + _score(s, lengths, j, i, code)
                if v > dp0[i]:
                    dp0[i] = v
                    prev0[i] = j
            if layers == 2 and dp1[j] > -np.inf:
                v = dp1[j] + _score(s, lengths, j, i, code)
                if v > dp1[i]:
                    dp1[i] = v
                    prev1[i] = j
        if layers == 2:
            for j in range(max(0, i - (b - 1)), i):
                if dp0[j] > -np.inf:
                    v = dp0[j] + _score(s, lengths, j, i, code)
                    if v > dp1[i]:
                        dp1[i] = v
                        prev1[i] = -(j + 2)
    return dp0, prev0, dp1, prev1


def _backtrack(prev0: np.ndarray, prev1: np.ndarray, n: int, start_layer: int) -> np.ndarray:
    ends = [n]
    i, layer = n, start_layer
    while i > 0:
        j = int(prev0[i] if layer == 0 else prev1[i])
        if layer == 1 and j < 0:
            j, layer = -j - 2, 0
        assert 0 <= j < i, "DP back-pointer chain is broken"
        ends.append(j)
        i = j
    return np.asarray(ends[::-1], dtype=np.int64)


def partition_sorted(
    sorted_lengths: np.ndarray,
    b: int,
    kappa: int,
    *,
    objective: DpObjective = "utilization",
    allow_small: bool = False,
) -> MinibatchPartition:
    """Exact DP partition of non-decreasing ``sorted_lengths`` into minibatches (O(kappa n))."""
    validate_sizes(b, kappa)
    if objective not in _OBJECTIVE_CODES:
        raise ValueError(f"unknown DP objective {objective!r}; choose one of {sorted(_OBJECTIVE_CODES)}")
    lengths = np.ascontiguousarray(sorted_lengths, dtype=np.float64)
    n = lengths.size
    if n == 0:
        raise ValueError("cannot build minibatches from zero items; pass at least b predicted lengths")
    if n < b and not allow_small:
        raise ValueError(
            f"only {n} items but the base minibatch size is b={b}; lower b, or pass "
            "allow_small=True to accept one minibatch smaller than b"
        )
    if np.any(np.diff(lengths) < 0):
        raise ValueError("partition_sorted needs lengths sorted in non-decreasing order; sort them first")
    use_short = not is_representable(n, b, kappa)
    code = _OBJECTIVE_CODES[objective]
    dp0, prev0, dp1, prev1 = _dp_kernel(lengths, int(b), int(kappa), code, use_short)
    layer = 1 if use_short else 0
    value = float(dp1[n] if use_short else dp0[n])
    assert np.isfinite(value), "a partition always exists once one short minibatch is allowed"
    endpoints = _backtrack(prev0, prev1, n, layer)
    return MinibatchPartition(
        endpoints=endpoints,
        num_short_minibatches=int(use_short),
        objective=objective,
        objective_value=value,
    )


def fixed_size_endpoints(n: int, b: int) -> np.ndarray:
    """Endpoints of consecutive size-``b`` minibatches; a final shorter one keeps every item."""
    if n <= 0:
        raise ValueError("cannot build minibatches from zero items")
    ends = list(range(0, n, b)) + [n]
    return np.asarray(ends, dtype=np.int64)
