"""Tau-controlled noisy oracle: the paper's protocol for predictions of known quality.

``pred_i = l_i * exp(nu * eps_i)`` with ``eps_i ~ N(0, 1)`` drawn once per seed. For a fixed
draw of ``eps`` every pair (i, j) is concordant for ``nu`` below ``|log l_i - log l_j| /
|eps_i - eps_j|`` and discordant above it, so Kendall tau is non-increasing in ``nu`` and a
bisection on ``nu`` hits any reachable target. Ranks are computed on ``log l + nu * eps``
(same order, no overflow for large ``nu``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from asp_scheduler.predictors.base import PromptItem
from asp_scheduler.rank_correlation import kendall_tau_b

TAU_TOLERANCE = 0.02
# At nu = 50 the ranking is that of eps to within rounding: tau has reached its floor.
_NU_MAX = 50.0
_BISECTION_STEPS = 60


@dataclass(frozen=True, slots=True)
class NoisyOracleResult:
    predictions: np.ndarray
    nu: float
    measured_tau: float


def _tau(x: np.ndarray, y: np.ndarray) -> float:
    value = kendall_tau_b(x, y)
    return 0.0 if np.isnan(value) else value


def _check_lengths(lengths: np.ndarray) -> np.ndarray:
    arr = np.asarray(lengths, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"the noisy oracle needs a 1-D array of at least 2 lengths, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(
            "the noisy oracle perturbs lengths multiplicatively, so every length must be finite "
            "and > 0; drop or fix zero/negative/NaN lengths first"
        )
    return arr


def _noise(size: int, seed: int) -> np.ndarray:
    # A stream of its own: users often draw their data with default_rng(seed) too.
    return np.random.default_rng([seed, 1]).standard_normal(size)


def noisy_oracle_with_nu(lengths: np.ndarray, nu: float, seed: int) -> NoisyOracleResult:
    """``l * exp(nu * eps)`` for a given ``nu`` (no search); same ``eps`` as the tau search."""
    if not np.isfinite(nu) or nu < 0:
        raise ValueError(f"nu (noise_sigma) must be finite and >= 0, got {nu}; e.g. 0.5")
    true = _check_lengths(lengths)
    log_pred = np.log(true) + nu * _noise(true.size, seed)
    return NoisyOracleResult(predictions=np.exp(log_pred), nu=float(nu), measured_tau=_tau(true, log_pred))


def noisy_oracle_predictions(lengths: np.ndarray, target_tau: float, seed: int) -> NoisyOracleResult:
    """Predictions whose Kendall tau against ``lengths`` is ``target_tau`` within 0.02."""
    if not 0.0 <= target_tau <= 1.0:
        raise ValueError(
            f"target_tau must lie in [0, 1], got {target_tau}; use e.g. 0.64 (the paper's ranker)"
        )
    true = _check_lengths(lengths)
    log_true = np.log(true)
    eps = _noise(true.size, seed)
    if target_tau >= 1.0:
        return NoisyOracleResult(predictions=true.copy(), nu=0.0, measured_tau=_tau(true, true))
    lo, hi = 0.0, _NU_MAX
    tau_hi = _tau(log_true, log_true + hi * eps)
    if tau_hi > target_tau + TAU_TOLERANCE:
        raise ValueError(
            f"target tau {target_tau} is unreachable on these {true.size} items with seed {seed} "
            f"(pure noise still gives tau {tau_hi:.3f}); use more items or a higher target"
        )
    nu, measured = hi, tau_hi
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        tau_mid = _tau(log_true, log_true + mid * eps)
        if abs(tau_mid - target_tau) < abs(measured - target_tau):
            nu, measured = mid, tau_mid
        if abs(tau_mid - target_tau) < 1e-3:
            break
        if tau_mid > target_tau:
            lo = mid
        else:
            hi = mid
    if abs(measured - target_tau) > TAU_TOLERANCE:
        raise ValueError(
            f"could not reach tau {target_tau} within {TAU_TOLERANCE} (best {measured:.3f}); "
            "too many tied lengths or too few items - use more items"
        )
    return NoisyOracleResult(predictions=np.exp(log_true + nu * eps), nu=nu, measured_tau=measured)


@dataclass(slots=True)
class NoisyOraclePredictor:
    """:class:`LengthPredictor` that knows the measured lengths and blurs them to a target tau.

    ``fit`` must see every prompt later passed to ``predict`` (it is an oracle); ids must be
    unique because each id carries one measured length.
    """

    target_tau: float = 0.64
    seed: int = 0
    name: str = "noisy_oracle"
    result: NoisyOracleResult | None = field(default=None, init=False)
    _index: dict[str, int] = field(default_factory=dict, init=False)

    def fit(self, prompts: Sequence[PromptItem], lengths: np.ndarray) -> NoisyOraclePredictor:
        lengths = np.asarray(lengths, dtype=np.float64)
        if len(prompts) != lengths.size:
            raise ValueError(
                f"got {len(prompts)} prompts but {lengths.size} lengths; pass one length per prompt"
            )
        index = {p.prompt_id: i for i, p in enumerate(prompts)}
        if len(index) != len(prompts):
            raise ValueError(
                "prompt ids must be unique for the noisy oracle (one measured length per id); "
                "make them unique, e.g. '<prompt_id>#<sample_idx>'"
            )
        self.result = noisy_oracle_predictions(lengths, self.target_tau, self.seed)
        self._index = index
        return self

    def predict(self, prompts: Sequence[PromptItem]) -> np.ndarray:
        if self.result is None:
            raise ValueError(
                "NoisyOraclePredictor.predict called before fit; call fit(prompts, lengths) first"
            )
        missing = [p.prompt_id for p in prompts if p.prompt_id not in self._index]
        if missing:
            raise ValueError(
                f"{len(missing)} prompt ids were not seen by fit (first: {missing[0]!r}); "
                "the oracle can only predict prompts whose lengths it was fitted on"
            )
        rows = np.fromiter((self._index[p.prompt_id] for p in prompts), dtype=np.int64, count=len(prompts))
        return self.result.predictions[rows].copy()
