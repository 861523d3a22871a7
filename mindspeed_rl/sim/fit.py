"""Fit the decode model ``t_step(active) = a + b · active`` (plus a per-minibatch overhead ``c``)
from measured engine runs.

Input: JSONL, one row per timed ``generate`` call in which every sequence decoded exactly the same
number of tokens (EOS ignored, ``min_tokens = max_tokens``)::

    {"batch_size": 16, "num_steps": 64, "seconds": 0.41}
    {"batch_size": 16, "num_tokens": 1024, "seconds": 0.41}     # num_steps = num_tokens / batch_size

With equal lengths ``L_max = S`` and ``Σ L = B · S``, so ``seconds = c + a · S + b · B · S`` — linear
in ``(1, S, B·S)``. A row may also carry ``sum_tokens`` (``Σ L`` of a minibatch whose responses
had different lengths; ``num_steps`` is then its longest response): that is how minibatches timed
inside a real pipeline run are fitted (``mindspeed_rl.sim.calibrate``). The coefficients are times and cannot be negative, so the fit is a
non-negative least squares (``scipy.optimize.nnls``) rather than an unconstrained one that could
return a negative per-token cost on noisy data. Use at least two batch sizes and two step counts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindspeed_rl.sim.timing import DecodeModel


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeRun:
    batch_size: int
    num_steps: float
    """Decode steps = the longest response's length (tokens)."""
    seconds: float
    sum_tokens: float | None = None
    """Tokens generated over all sequences; ``None`` means every sequence ran ``num_steps``."""

    def __post_init__(self) -> None:
        if self.batch_size < 1 or not self.num_steps > 0 or not self.seconds > 0:
            raise ValueError(
                f"a decode run needs batch_size >= 1, num_steps > 0 and seconds > 0, got {self}."
            )
        if (
            self.sum_tokens is not None
            and not self.num_steps <= self.sum_tokens <= self.batch_size * self.num_steps
        ):
            raise ValueError(
                f"sum_tokens={self.sum_tokens} must lie between num_steps and batch_size x num_steps: {self}."
            )

    @property
    def tokens(self) -> float:
        return self.batch_size * self.num_steps if self.sum_tokens is None else self.sum_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeFit:
    model: DecodeModel
    r2: float
    max_relative_error: float
    num_runs: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "decode": asdict(self.model),
            "r2": self.r2,
            "max_relative_error": self.max_relative_error,
            "num_runs": self.num_runs,
        }


def read_runs(path: str | Path) -> list[DecodeRun]:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"runs file {path} does not exist; write one JSON row per timed generate call.")
    runs = []
    for line_no, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "batch_size" not in row or "seconds" not in row or not ({"num_steps", "num_tokens"} & set(row)):
            raise ValueError(
                f"{path}:{line_no}: needs batch_size, seconds and num_steps (or num_tokens); got {sorted(row)}."
            )
        batch = int(row["batch_size"])
        steps = float(row["num_steps"]) if "num_steps" in row else float(row["num_tokens"]) / batch
        total = None if row.get("sum_tokens") is None else float(row["sum_tokens"])
        runs.append(
            DecodeRun(batch_size=batch, num_steps=steps, seconds=float(row["seconds"]), sum_tokens=total)
        )
    return runs


def write_runs(path: str | Path, runs: Sequence[DecodeRun]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(asdict(r)) + "\n" for r in runs))


def fit_decode(runs: Sequence[DecodeRun], *, fit_overhead: bool = True, relative: bool = True) -> DecodeFit:
    """Non-negative least squares of ``seconds ~ c + a·S + b·B·S`` (``c = 0`` without overhead).

    ``relative``: weight each row by ``1 / seconds``. Right for a benchmark grid whose runs span
    orders of magnitude; wrong for noisy minibatches timed inside a pipeline, where it pulls the
    fit below the mean (a slow outlier counts less than a fast one) and the simulator needs the
    total time right, so ``calibrate`` fits those unweighted."""
    from scipy.optimize import nnls

    s = np.array([r.num_steps for r in runs], dtype=np.float64)
    tokens = np.array([r.tokens for r in runs], dtype=np.float64)
    y = np.array([r.seconds for r in runs], dtype=np.float64)
    columns = [s, tokens] + ([np.ones_like(s)] if fit_overhead else [])
    design = np.stack(columns, axis=1)
    if np.linalg.matrix_rank(design) < design.shape[1]:
        batches = sorted({r.batch_size for r in runs})
        steps = sorted({r.num_steps for r in runs})
        raise ValueError(
            f"cannot separate the coefficients from {len(runs)} runs with batch sizes {batches} and "
            f"step counts {steps}; time at least two batch sizes and two step counts."
        )
    weights = 1.0 / y if relative else np.ones_like(y)
    coef, _ = nnls(design * weights[:, None], y * weights)
    pred = design @ coef
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    model = DecodeModel(
        per_step_seconds=float(coef[0]),
        per_token_seconds=float(coef[1]),
        per_minibatch_seconds=float(coef[2]) if fit_overhead else 0.0,
    )
    return DecodeFit(
        model=model,
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        max_relative_error=float(np.max(np.abs(pred - y) / y)),
        num_runs=len(runs),
    )
