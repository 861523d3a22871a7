"""Ablation C0-C4 (paper F.6.2) over controlled predictor qualities and seeds.

C0 fixed-size minibatches of b in file order; C1 sort by prediction then fixed size; C2 sort
+ DP boundaries; C3 the C2 minibatches in a random order; C4 full ASP (C2 + SA ordering).
``C4_calibrated`` (beyond the paper) balances on isotonic-calibrated loads, fitted on a random
``calibration_fraction`` (default 20%) of items as if those had been profiled. For a given
(tau, seed) every condition sees the same prediction vector; metrics are always computed on the
measured lengths.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from asp_scheduler.calibration import IsotonicCalibrator, profiled_indices
from asp_scheduler.metrics import schedule_metrics
from asp_scheduler.minibatch import fixed_size_endpoints, partition_sorted
from asp_scheduler.params import PAPER_DEFAULTS, ScheduleParams
from asp_scheduler.predictors.base import evaluate_predictor
from asp_scheduler.predictors.noisy_oracle import noisy_oracle_predictions
from asp_scheduler.schedule import Schedule, build_schedule, fixed_order_schedule, ordered_schedule

CONDITIONS = ("C0", "C1", "C2", "C3", "C4")
METRICS = ("dispersion", "padding", "group_cv", "group_spread")


def _split(order: np.ndarray, endpoints: np.ndarray) -> list[np.ndarray]:
    return np.split(order, endpoints[1:-1])


def condition_schedules(
    predictions: np.ndarray,
    params: ScheduleParams,
    calibrated: np.ndarray | None = None,
    *,
    item_ids: list[str] | None = None,
) -> dict[str, Schedule]:
    """The ``Schedule`` of every condition for one prediction vector (``C4_calibrated`` too when
    ``calibrated`` loads are given). C3's shuffle and C4's SA use ``params.seed``."""
    n = predictions.size
    order = np.argsort(predictions, kind="stable")
    # C1-C3 run no SA; their params say so, so a saved C1-C3 schedule is not mistaken for ASP.
    no_sa = replace(params, sa_iterations=0, shuffle_groups=False, calibrate_loads=False)
    fixed = fixed_size_endpoints(n, params.b)
    c2 = _split(
        order,
        partition_sorted(
            predictions[order],
            params.b,
            params.kappa,
            objective=params.dp_objective,
            allow_small=params.allow_small,
        ).endpoints,
    )
    shuffled = np.random.default_rng(params.seed).permutation(len(c2))
    out = {
        "C0": fixed_order_schedule(predictions, params.b, params.k, item_ids=item_ids),
        "C1": ordered_schedule(
            predictions, _split(order, fixed), replace(no_sa, kappa=0, allow_small=True), item_ids=item_ids
        ),
        "C2": ordered_schedule(predictions, c2, no_sa, item_ids=item_ids),
        "C3": ordered_schedule(predictions, [c2[i] for i in shuffled], no_sa, item_ids=item_ids),
        "C4": build_schedule(predictions, replace(params, calibrate_loads=False), item_ids=item_ids),
    }
    if calibrated is not None:
        out["C4_calibrated"] = build_schedule(
            predictions,
            replace(params, calibrate_loads=True),
            calibrated_lengths=calibrated,
            item_ids=item_ids,
        )
    return out


def _calibrated(lengths: np.ndarray, predictions: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    profiled = profiled_indices(lengths.size, fraction, seed)
    return IsotonicCalibrator.fit(predictions[profiled], lengths[profiled]).transform(predictions)


def _one_seed(lengths: np.ndarray, tau: float, params: ScheduleParams) -> dict[str, Any]:
    oracle = noisy_oracle_predictions(lengths, tau, params.seed)
    quality = evaluate_predictor(oracle.predictions, lengths)
    cal = (
        _calibrated(lengths, oracle.predictions, params.calibration_fraction, params.seed)
        if params.calibrate_loads
        else None
    )
    schedules = condition_schedules(oracle.predictions, params, cal)
    metrics = {
        name: schedule_metrics(lengths, s.minibatches, params.k).as_dict() for name, s in schedules.items()
    }
    return {"seed": params.seed, "measured_tau": quality.kendall_tau, "mae": quality.mae_tokens, **metrics}


def _one_tau(lengths: np.ndarray, tau: float, seeds: int, params: ScheduleParams) -> dict[str, Any]:
    per_seed = [_one_seed(lengths, tau, replace(params, seed=params.seed + i)) for i in range(seeds)]
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
    lengths: np.ndarray, taus: list[float], seeds: int, params: ScheduleParams = PAPER_DEFAULTS
) -> dict[str, object]:
    """``{"results": [...]}`` with one entry per target tau (means over ``seeds`` seeds).

    Seeds are ``params.seed, params.seed + 1, ...``; each drives the oracle, the profiled subset,
    C3's shuffle and the SA. ``params.calibrate_loads`` adds ``C4_calibrated``.
    """
    if seeds <= 0:
        raise ValueError(f"--seeds must be a positive integer, got {seeds}")
    if not taus:
        raise ValueError("give at least one target tau, e.g. --tau 0.64")
    if lengths.size < params.b:
        raise ValueError(f"only {lengths.size} items but b={params.b}; use a larger file or a smaller --b")
    return {"results": [_one_tau(lengths, float(t), seeds, params) for t in taus]}


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
