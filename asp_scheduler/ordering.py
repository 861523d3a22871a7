"""Algorithm 2: balanced batch-group ordering by simulated annealing (numba kernel).

Objective: ``V = (1/G) * sum_g (L_g - T_g)^2`` over groups of ``k`` consecutive positions,
``G = ceil(N_B / k)``. A swap of positions ``i`` (group a) and ``j`` (group b) with
``x = B_j - B_i`` changes V by ``2 x (d_a - d_b + x) / G`` where ``d_g = L_g - T_g``; the kernel
keeps ``d`` in a flat float64 array, so each iteration is O(1) whatever N_B is.

Decisions and departures from the paper:
* Partial last group: the paper uses one target ``M = sum(B) / G`` for every group, which
  pushes heavy minibatches into a short last group. Here ``T_g = s_g * mean(B)`` for a group of
  ``s_g`` minibatches (identical to M when k divides N_B).
* Proposals are two distinct positions drawn uniformly; a pair inside one group has delta 0, is
  accepted with probability exactly 1 (no uniform drawn) and counts as an iteration.
* Acceptance is the paper's exact rule ``U < exp(-delta * log(n + 2) / C)``. Because
  ``exp(-z) == 0`` in float64 for ``z > 745.2``, an uphill move whose ``z`` (computed with a lower
  bound of ``log(n + 2)`` refreshed every 65,536 iterations) exceeds 746 is rejected without
  calling log/exp or drawing U; this changes no decision. ``C = 0`` means greedy (accept iff
  delta <= 0).
* Scale: V is in tokens^2, so with C = 1 the temperature (< 1.5 tokens^2) only admits uphill
  moves smaller than ~1000 tokens^2 / G: SA with C = 1 is nearly greedy descent with random
  swaps. ``normalize=True`` divides loads by their mean first (V in units of mean-load^2), which
  makes C relative; with C = 1 that is far too hot (see README for measurements).
* RNG: xorshift64* inlined in the kernel (not np.random); positions use Lemire's
  multiply-shift, biased by < N_B / 2^32 (negligible; N_B must be < 2^32).
* The kernel returns the better of the start and the end permutation, so the result is never
  worse than ``sigma_0`` (uphill moves can otherwise, rarely, end above the start).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

_MASK32 = np.uint64(0xFFFFFFFF)
_MULT = np.uint64(0x2545F4914F6CDD1D)
_EXP_UNDERFLOW_Z = 746.0
_LOG_REFRESH = 65536


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderingResult:
    permutation: np.ndarray
    """``permutation[p]`` = index of the minibatch dispatched at position p."""
    initial_objective: float
    final_objective: float
    num_accepted: int
    num_iterations: int

    @property
    def variance_reduction(self) -> float:
        if self.initial_objective <= 0.0:
            return 0.0
        return 1.0 - self.final_objective / self.initial_objective


@numba.njit(cache=True)
def group_deviations(pos_loads: np.ndarray, k: int, mean_load: float) -> np.ndarray:
    n = pos_loads.size
    num_groups = (n + k - 1) // k
    dev = np.zeros(num_groups)
    for p in range(n):
        dev[p // k] += pos_loads[p] - mean_load
    return dev


@numba.njit(cache=True)
def objective(pos_loads: np.ndarray, k: int) -> float:
    """V for loads listed in dispatch order (group targets proportional to group size)."""
    dev = group_deviations(pos_loads, k, pos_loads.mean())
    return float(np.sum(dev * dev) / dev.size)


@numba.njit(cache=True)
def _anneal(pos_loads, perm, dev, k, num_iterations, inv_c, inv_g, seed):
    n = pos_loads.size
    # xorshift64* state kept in a local so LLVM holds it in a register.
    x_state = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x632BE59BD9B4E019)
    if x_state == np.uint64(0):
        x_state = np.uint64(1)
    n_u = np.uint64(n)
    n_minus = np.uint64(n - 1)
    inv_k = 1.0 / k
    greedy = inv_c == np.inf
    accepted = 0
    log_lo = math.log(2.0)
    for it in range(num_iterations):
        if (it & (_LOG_REFRESH - 1)) == 0:
            log_lo = math.log(it + 2.0)
        x_state ^= x_state >> np.uint64(12)
        x_state ^= x_state << np.uint64(25)
        x_state ^= x_state >> np.uint64(27)
        r = x_state * _MULT
        iu = ((r >> np.uint64(32)) * n_u) >> np.uint64(32)
        ju = ((r & _MASK32) * n_minus) >> np.uint64(32)
        if ju >= iu:
            ju += np.uint64(1)
        i = np.int64(iu)
        j = np.int64(ju)
        # (p + 0.5) / k is at least 0.5 / k away from an integer, far above float64 rounding
        # for p < 2^32, so truncation equals p // k without an integer division.
        ga = np.int64((i + 0.5) * inv_k)
        gb = np.int64((j + 0.5) * inv_k)
        li = pos_loads[i]
        lj = pos_loads[j]
        if ga != gb:
            x = lj - li
            a = ga
            bb = gb
            delta = 2.0 * x * (dev[a] - dev[bb] + x) * inv_g
            if delta > 0.0:
                if greedy or delta * inv_c * log_lo > _EXP_UNDERFLOW_Z:
                    continue
                z = delta * inv_c * math.log(it + 2.0)
                x_state ^= x_state >> np.uint64(12)
                x_state ^= x_state << np.uint64(25)
                x_state ^= x_state >> np.uint64(27)
                u = np.float64((x_state * _MULT) >> np.uint64(11)) * (1.0 / 9007199254740992.0)
                if not u < math.exp(-z):
                    continue
            dev[a] += x
            dev[bb] -= x
        accepted += 1
        pos_loads[i] = lj
        pos_loads[j] = li
        t = perm[i]
        perm[i] = perm[j]
        perm[j] = t
    return accepted


def validate_group_size(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k <= 0:
        raise ValueError(f"k (minibatches per batch group) must be a positive integer, got {k!r}; e.g. k=6")


def anneal_order(
    loads: np.ndarray,
    k: int,
    *,
    num_iterations: int = 2_000_000,
    c: float = 1.0,
    seed: int = 0,
    normalize: bool = False,
    initial_permutation: np.ndarray | None = None,
) -> OrderingResult:
    """Order minibatches (``loads[m]`` = predicted load of minibatch m) into balanced groups."""
    validate_group_size(k)
    loads = np.asarray(loads, dtype=np.float64)
    if loads.ndim != 1 or loads.size == 0:
        raise ValueError(f"loads must be a non-empty 1-D array, got shape {loads.shape}")
    if not np.all(np.isfinite(loads)):
        raise ValueError("minibatch loads must be finite; check the predicted lengths for NaN/inf")
    if num_iterations < 0 or c < 0 or not math.isfinite(c):
        raise ValueError(f"need sa_iterations >= 0 and a finite sa_constant >= 0, got {num_iterations}, {c}")
    if loads.size >= 2**32:
        raise ValueError("at most 2^32 - 1 minibatches are supported by the SA kernel")
    perm = (
        np.arange(loads.size, dtype=np.int64) if initial_permutation is None else initial_permutation.copy()
    )
    scale = float(loads.mean()) if normalize and loads.mean() > 0 else 1.0
    pos_loads = loads[perm] / scale
    start = objective(pos_loads, k)
    num_groups = -(-loads.size // k)
    accepted = 0
    if loads.size >= 2 and num_iterations > 0:
        dev = group_deviations(pos_loads, k, pos_loads.mean())
        inv_c = math.inf if c == 0 else 1.0 / c
        accepted = _anneal(
            pos_loads, perm, dev, int(k), int(num_iterations), inv_c, 1.0 / num_groups, int(seed)
        )
    end = objective(loads[perm] / scale, k)
    if end > start:
        perm = (
            np.arange(loads.size, dtype=np.int64)
            if initial_permutation is None
            else initial_permutation.copy()
        )
        end = start
    return OrderingResult(
        permutation=perm,
        initial_objective=start * scale * scale,
        final_objective=end * scale * scale,
        num_accepted=int(accepted),
        num_iterations=int(num_iterations),
    )
