"""Length drift: response lengths that move while the policy learns, over a two-epoch run.

A uniform scale-up of every length leaves an offline balance intact (every load scales alike),
so the models here are heterogeneous: each generation of prompt ``p`` at run progress
``t = policy_version / num_steps`` (0 at the start, 1 at the end) has its base lengths (the
workload's) multiplied by ``m_p(t)``, rounded and clipped to ``[1, max_tokens]``.

* ``none``: ``m = 1``.
* ``hetero2x`` (as DAPO / R1-Zero report: mean length grows 2-3x, prompts the policy learns to
  solve get shorter answers, hard ones longer): ``log m_p(t) = t * mu + h(t) * spread * z_p``
  with a fixed per-prompt difficulty ``z_p = rho * zscore(log base length_p) + sqrt(1 - rho^2) * xi_p``
  (``xi ~ N(0, 1)``): harder prompts tend to start longer too, at correlation ``rho``.
  ``mu = log(growth) - log(mean_p exp(spread * z_p))``, so the prompts' mean multiplier at
  ``t = 1`` is exactly ``growth``. ``h`` says when a prompt's own part moves: with ``onset`` set,
  ``h(t) = (1 - exp(-t / onset)) / (1 - exp(-1 / onset))`` (most of it early: a prompt is learned,
  or found hard, in the first part of the run, then its length follows the mean); ``onset: null``
  gives ``h(t) = t`` (it keeps moving at one rate to the end). Its direction is fixed, so a
  prompt's history predicts its future.
* ``noise2x``: ``log m_{p,e}(t) = t * (mu + spread * zeta_{p,e})`` with ``zeta`` drawn afresh for
  every generation (prompt ``p`` in epoch ``e``), ``mu = log(growth) - spread^2 / 2``: the same
  mean growth and spread, but the per-prompt part is pure noise that nothing can predict.

Two epochs (:func:`two_epochs`): every prompt runs twice, as ``<id>#e0`` then ``<id>#e1``, so
per-prompt history exists in the second epoch. The second pass resamples each response's length
around the first (log-normal, ``resample_sigma``), as a new sampling of the same prompt would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from mindspeed_rl.sim.workload import Workload

DRIFTS = ("none", "hetero2x", "noise2x")
EPOCH_SEP = "#e"


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftParams:
    """The documented parameters of every drift model (see the module docstring)."""

    growth: float = 2.0
    """Mean length multiplier over prompts at the end of the run (t = 1)."""
    spread: float = 0.8
    """Log-space STD of the per-prompt multiplier at t = 1."""
    difficulty_length_corr: float = 0.5
    """hetero2x: correlation of a prompt's difficulty z with its log base length."""
    resample_sigma: float = 0.3
    """Log-space STD of a response's length in epoch 2 around its epoch-1 length."""
    max_tokens: int = 32768
    """Response cap of the drifted run (above the base workload's, so growth is not clipped away)."""
    onset: float | None = 0.15
    """hetero2x: time constant (share of the run) of the per-prompt part; None: linear in t."""

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)


def two_epochs(workload: Workload, *, seed: int, resample_sigma: float) -> Workload:
    """The workload run twice: ``<id>#e0`` rows are the base, ``<id>#e1`` rows resampled."""
    rng = np.random.default_rng([seed, 31])
    base = workload.lengths.astype(np.float64)
    noise = np.exp(resample_sigma * rng.standard_normal(base.shape) - 0.5 * resample_sigma**2)
    cap = int(workload.lengths.max())
    second = np.clip(np.rint(base * noise), 1, cap).astype(np.int64)
    ids = tuple(f"{p}{EPOCH_SEP}0" for p in workload.prompt_ids) + tuple(
        f"{p}{EPOCH_SEP}1" for p in workload.prompt_ids
    )
    return Workload(
        prompt_ids=ids,
        lengths=np.concatenate([workload.lengths, second]),
        source=f"{workload.source} x 2 epochs",
    )


def prompt_key(item_id: str) -> str:
    """The prompt behind a two-epoch item id (``s5#e1`` -> ``s5``)."""
    return item_id.rsplit(EPOCH_SEP, 1)[0]


def epoch_of(item_id: str) -> int:
    return int(item_id.rsplit(EPOCH_SEP, 1)[1])


class DriftModel:
    """Lengths of a generation of workload rows at run progress ``t`` (see the module docstring)."""

    def __init__(self, name: str, workload: Workload, params: DriftParams, *, seed: int) -> None:
        if name not in DRIFTS:
            raise ValueError(f"unknown length drift {name!r}; choose from {DRIFTS}.")
        self.name, self.params, self.workload = name, params, workload
        rng = np.random.default_rng([seed, 37])
        keys = [prompt_key(p) for p in workload.prompt_ids]
        unique = sorted(set(keys), key=keys.index)
        index = {k: i for i, k in enumerate(unique)}
        self._prompt_of_row = np.array([index[k] for k in keys], dtype=np.int64)
        s = params.spread
        if name == "hetero2x":
            first_rows = np.array([keys.index(k) for k in unique])
            log_len = np.log(workload.lengths[first_rows].mean(axis=1))
            std = log_len.std()
            standard = (log_len - log_len.mean()) / std if std > 0 else np.zeros_like(log_len)
            rho = params.difficulty_length_corr
            z = rho * standard + np.sqrt(1 - rho**2) * rng.standard_normal(len(unique))
            mu = np.log(params.growth) - np.log(np.mean(np.exp(s * z)))
            self._log_mean = mu
            self._log_rate = s * z[self._prompt_of_row]
            # The part of the rate a run could know before the prompt is generated (its length).
            self._log_rate_knowable = s * rho * standard[self._prompt_of_row]
        elif name == "noise2x":
            zeta = rng.standard_normal(len(workload.prompt_ids))
            self._log_mean = np.log(params.growth) - 0.5 * s * s
            self._log_rate = s * zeta
            self._log_rate_knowable = np.zeros(len(workload.prompt_ids))
        else:
            self._log_mean = 0.0
            self._log_rate = np.zeros(len(workload.prompt_ids))
            self._log_rate_knowable = self._log_rate
        first_of: dict[str, int] = {}
        for row, key in enumerate(keys):
            first_of.setdefault(key, row)
        self._first_row = np.array([first_of[k] for k in keys], dtype=np.int64)

    def _h(self, t: float) -> float:
        onset = self.params.onset
        if self.name != "hetero2x" or onset is None:
            return t
        return float(np.expm1(-t / onset) / np.expm1(-1.0 / onset))

    def informed_estimates(self, rows: Sequence[int], progress: float) -> np.ndarray:
        """An estimator better informed than any run can be, for bounding what online ASP can
        reach (``simulate.py --online-bound``): each row's expected length at ``progress`` from
        the model itself. A prompt's first generation knows its exact base length (a run has
        only a noisy prediction of it) and the part of its drift its length predicts, not its own
        difficulty ``xi_p``; a later generation knows the prompt's whole rate and the first
        generation's base lengths (a run sees only one noisy, clipped sample of them), but not
        the resampling (``resample_sigma``) nor, under ``noise2x``, the fresh draw. Factors shared
        by every prompt cancel in a balance, but the cap clips long answers, so the mean growth is
        applied and each of the first generation's samples clipped, as ``lengths`` does."""
        index = np.asarray(list(rows), dtype=np.int64)
        first = self._first_row[index]
        base = self.workload.lengths[first].astype(np.float64)
        # A repeat knows the whole rate only where it is the prompt's (hetero2x), not a fresh draw.
        own_known = (first != index) & (self.name == "hetero2x")
        rate = np.where(own_known, self._log_rate[index], self._log_rate_knowable[index])
        t = min(max(progress, 0.0), 1.0)
        log_factor = t * self._log_mean + self._h(t) * rate
        if self.name == "hetero2x":  # the unknown own part's mean: E exp(a xi) = exp(a^2 / 2)
            unknown = self._h(t) * self.params.spread * np.sqrt(1 - self.params.difficulty_length_corr**2)
            log_factor = log_factor + np.where(own_known, 0.0, 0.5 * unknown**2)
        return np.clip(base * np.exp(log_factor)[:, None], 1.0, self.params.max_tokens).mean(axis=1)

    def lengths(self, rows: Sequence[int], progress: float) -> np.ndarray:
        """``(len(rows), n)`` token counts of one generation at ``progress`` in [0, 1]."""
        base = self.workload.lengths[list(rows)]
        if self.name == "none":
            return base
        t = min(max(progress, 0.0), 1.0)
        factor = np.exp(t * self._log_mean + self._h(t) * self._log_rate[list(rows)])[:, None]
        return np.clip(np.rint(base * factor), 1, self.params.max_tokens).astype(np.int64)
