"""``ScheduleParams``: every knob of the offline scheduler, declared once.

The CLI, the ablation, the simulator's conditions and ``asp_config`` all build this one record,
and the saved ``Schedule`` carries it, so a schedule file says exactly how it was made.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, get_args

import numpy as np

from asp_scheduler.minibatch import DpObjective, validate_sizes
from asp_scheduler.ordering import validate_group_size


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleParams:
    """Scheduler settings; defaults are the paper's (b=32, kappa=2, k=6, 2e6 SA steps, C=1).

    Sizes are in items (prompts).
    """

    b: int = 32
    """Base minibatch size: Algorithm 1 cuts minibatches of b to b + kappa items."""
    kappa: int = 2
    """Allowed minibatch size variation above ``b`` (0: every minibatch has exactly b items)."""
    k: int = 6
    """Minibatches per batch group; Algorithm 2 balances the loads of these groups."""
    sa_iterations: int = 2_000_000
    """Simulated-annealing iterations n_max (0: keep the sorted order)."""
    sa_constant: float = 1.0
    """SA temperature constant C in T_n = C / log(n + 2) (0: greedy descent)."""
    seed: int = 0
    """Seed of SA, group shuffling, and of the profiled subset drawn for calibration."""
    shuffle_groups: bool = False
    """Shuffle whole batch groups after SA (each group keeps its balance; a short last group stays last)."""
    calibrate_loads: bool = False
    """Balance groups on isotonic-calibrated loads E[measured | predicted] instead of raw predictions."""
    calibration_fraction: float = 0.2
    """Share of items (or of pair prompt ids) profiled to fit the calibrator / score a predictor."""
    dp_objective: DpObjective = "utilization"
    """Algorithm 1's objective: ``utilization`` (the paper's sum of R) or ``padded_slots``."""
    normalize: bool = False
    """Divide loads by their mean before SA, which makes C relative (see the README: no gain)."""
    allow_small: bool = False
    """Accept fewer than ``b`` items as one short minibatch instead of raising."""

    def __post_init__(self) -> None:
        validate_sizes(self.b, self.kappa)
        validate_group_size(self.k)
        _check_int("sa_iterations", self.sa_iterations, "e.g. sa_iterations=2000000")
        _check_int("seed", self.seed, "numpy seeds must be >= 0, e.g. seed=0")
        if isinstance(self.sa_constant, bool) or not (
            isinstance(self.sa_constant, int | float)
            and math.isfinite(self.sa_constant)
            and self.sa_constant >= 0
        ):
            raise ValueError(
                f"sa_constant (SA temperature C) must be a finite number >= 0, got {self.sa_constant!r}; "
                "e.g. sa_constant=1.0"
            )
        fraction = self.calibration_fraction
        if isinstance(fraction, bool) or not (isinstance(fraction, int | float) and 0.0 < fraction < 1.0):
            raise ValueError(
                f"calibration_fraction must be in (0, 1), got {self.calibration_fraction!r}; e.g. 0.2 "
                "profiles a random 20% of the items"
            )
        if self.dp_objective not in get_args(DpObjective):
            raise ValueError(
                f"unknown dp_objective {self.dp_objective!r}; choose one of {list(get_args(DpObjective))}"
            )
        for name in ("shuffle_groups", "calibrate_loads", "normalize", "allow_small"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, where: str = "schedule params") -> ScheduleParams:
        """Build from a dict (a saved schedule, a YAML section); unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in {where}; valid keys: {sorted(known)}")
        return cls(**data)


def _check_int(name: str, value: object, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}; {hint}")


PAPER_DEFAULTS = ScheduleParams()
"""The paper's settings; frozen, so safe as a shared default argument."""
