"""Fit the decode model ``t_step(active) = a + b · active`` (plus a per-minibatch overhead ``c``)
from measured engine runs.

Input: JSONL, one row per timed ``generate`` call in which every sequence decoded exactly the same
number of tokens (EOS ignored, ``min_tokens = max_tokens``)::

    {"batch_size": 16, "num_steps": 64, "seconds": 0.41}
    {"batch_size": 16, "num_tokens": 1024, "seconds": 0.41}     # num_steps = num_tokens / batch_size

With equal lengths ``L_max = S`` and ``Σ L = B · S``, so ``seconds = c + a · S + b · B · S`` — linear
in ``(1, S, B·S)``. The coefficients are times and cannot be negative, so the fit is a
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
    seconds: float

    def __post_init__(self) -> None:
        if self.batch_size < 1 or not self.num_steps > 0 or not self.seconds > 0:
            raise ValueError(
                f"a decode run needs batch_size >= 1, num_steps > 0 and seconds > 0, got {self}."
            )


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
        runs.append(DecodeRun(batch_size=batch, num_steps=steps, seconds=float(row["seconds"])))
    return runs


def write_runs(path: str | Path, runs: Sequence[DecodeRun]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(asdict(r)) + "\n" for r in runs))


def fit_decode(runs: Sequence[DecodeRun], *, fit_overhead: bool = True) -> DecodeFit:
    """Non-negative least squares of ``seconds ~ c + a·S + b·B·S`` (``c = 0`` without overhead)."""
    from scipy.optimize import nnls

    batches = {r.batch_size for r in runs}
    steps = {r.num_steps for r in runs}
    if len(batches) < 2 or (fit_overhead and len(steps) < 2):
        raise ValueError(
            f"cannot separate the coefficients from {len(runs)} runs with batch sizes {sorted(batches)} and "
            f"step counts {sorted(steps)}; time at least two batch sizes and two step counts."
        )
    s = np.array([r.num_steps for r in runs])
    b = np.array([r.batch_size for r in runs], dtype=np.float64)
    y = np.array([r.seconds for r in runs])
    columns = [s, b * s] + ([np.ones_like(s)] if fit_overhead else [])
    design = np.stack(columns, axis=1)
    # Relative errors matter (runs span orders of magnitude): weight each row by 1 / seconds.
    coef, _ = nnls(design / y[:, None], np.ones_like(y))
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
