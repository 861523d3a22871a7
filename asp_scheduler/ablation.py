"""Ablation C0-C4 (paper F.6.2) over controlled predictor qualities and seeds.

C0 fixed-size minibatches of b in file order; C1 sort by prediction then fixed size; C2 sort
+ DP boundaries; C3 the C2 minibatches in a random order; C4 full ASP (C2 + SA ordering).
``C4_calibrated`` (beyond the paper) balances on isotonic-calibrated loads, fitted on a random
20% of items as if those had been profiled. For a given (tau, seed) every condition sees the
same prediction vector; metrics are always computed on the measured lengths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from asp_scheduler.calibration import IsotonicCalibrator
from asp_scheduler.metrics import schedule_metrics
from asp_scheduler.minibatch import fixed_size_endpoints, partition_sorted, validate_sizes
from asp_scheduler.ordering import validate_group_size
from asp_scheduler.predictors.base import evaluate_predictor
from asp_scheduler.predictors.noisy_oracle import noisy_oracle_predictions
from asp_scheduler.schedule import build_schedule

CONDITIONS = ("C0", "C1", "C2", "C3", "C4")
METRICS = ("dispersion", "padding", "group_cv", "group_spread")


@dataclass(frozen=True, slots=True, kw_only=True)
class AblationConfig:
    b: int = 32
    kappa: int = 2
    k: int = 6
    sa_iterations: int = 2_000_000
    sa_constant: float = 1.0
    calibrate: bool = False
    calibration_fraction: float = 0.2
    """Share of items whose (prediction, measured length) pairs fit the calibrator."""


def _split(order: np.ndarray, endpoints: np.ndarray) -> list[np.ndarray]:
    return np.split(order, endpoints[1:-1])


def condition_minibatches(
    predictions: np.ndarray, cfg: AblationConfig, seed: int, calibrated: np.ndarray | None = None
) -> dict[str, list[np.ndarray]]:
    """Minibatches (index arrays, dispatch order) of every condition for one prediction vector."""
    n = predictions.size
    order = np.argsort(predictions, kind="stable")
    fixed = fixed_size_endpoints(n, cfg.b)
    c2 = _split(order, partition_sorted(predictions[order], cfg.b, cfg.kappa).endpoints)
    shuffled = np.random.default_rng(seed).permutation(len(c2))
    out = {
        "C0": _split(np.arange(n), fixed),
        "C1": _split(order, fixed),
        "C2": c2,
        "C3": [c2[i] for i in shuffled],
    }
    out["C4"] = _asp(predictions, cfg, seed, None)
    if calibrated is not None:
        out["C4_calibrated"] = _asp(predictions, cfg, seed, calibrated)
    return out


def _asp(
    predictions: np.ndarray, cfg: AblationConfig, seed: int, calibrated: np.ndarray | None
) -> list[np.ndarray]:
    schedule = build_schedule(
        predictions,
        cfg.b,
        cfg.kappa,
        cfg.k,
        cfg.sa_iterations,
        cfg.sa_constant,
        seed,
        calibrated_lengths=calibrated,
    )
    return schedule.minibatches


def _calibrated(lengths: np.ndarray, predictions: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 2])
    profiled = rng.choice(lengths.size, size=max(2, int(round(fraction * lengths.size))), replace=False)
    return IsotonicCalibrator.fit(predictions[profiled], lengths[profiled]).transform(predictions)


def _one_tau(lengths: np.ndarray, tau: float, seeds: int, cfg: AblationConfig) -> dict[str, Any]:
    per_seed: list[dict[str, Any]] = []
    for seed in range(seeds):
        oracle = noisy_oracle_predictions(lengths, tau, seed)
        quality = evaluate_predictor(oracle.predictions, lengths)
        cal = (
            _calibrated(lengths, oracle.predictions, cfg.calibration_fraction, seed)
            if cfg.calibrate
            else None
        )
        batches = condition_minibatches(oracle.predictions, cfg, seed, cal)
        metrics = {name: schedule_metrics(lengths, mbs, cfg.k).as_dict() for name, mbs in batches.items()}
        per_seed.append(
            {"seed": seed, "measured_tau": quality.kendall_tau, "mae": quality.mae_tokens, **metrics}
        )
    names = [c for c in per_seed[0] if c.startswith("C")]
    seed_mean = {c: {m: float(np.mean([s[c][m] for s in per_seed])) for m in METRICS} for c in names}
    return {
        "tau": tau,
        "measured_tau": float(np.mean([s["measured_tau"] for s in per_seed])),
        "mae": float(np.mean([s["mae"] for s in per_seed])),
        "seed_mean": seed_mean,
        "per_seed": per_seed,
    }


def run_ablation(
    lengths: np.ndarray, taus: list[float], seeds: int, cfg: AblationConfig
) -> dict[str, object]:
    """``{"results": [...]}`` with one entry per target tau (means over ``seeds`` seeds)."""
    validate_sizes(cfg.b, cfg.kappa)
    validate_group_size(cfg.k)
    if seeds <= 0:
        raise ValueError(f"--seeds must be a positive integer, got {seeds}")
    if not taus:
        raise ValueError("give at least one target tau, e.g. --tau 0.64")
    if lengths.size < cfg.b:
        raise ValueError(f"only {lengths.size} items but b={cfg.b}; use a larger file or a smaller --b")
    return {"results": [_one_tau(lengths, float(t), seeds, cfg) for t in taus]}


def to_markdown(report: dict[str, object]) -> str:
    """One table per metric: rows are target taus, columns the conditions."""
    results: list[dict] = report["results"]  # type: ignore[assignment]
    names = list(results[0]["seed_mean"])
    lines = []
    for metric in METRICS:
        lines += [f"### {metric}", "", "| tau | measured tau | MAE | " + " | ".join(names) + " |"]
        lines.append("|" + "---|" * (3 + len(names)))
        for r in results:
            cells = " | ".join(_fmt(r["seed_mean"][c][metric]) for c in names)
            lines.append(f"| {r['tau']:.2f} | {r['measured_tau']:.3f} | {r['mae']:.0f} | {cells} |")
        lines.append("")
    return "\n".join(lines)


def _fmt(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3f}"
