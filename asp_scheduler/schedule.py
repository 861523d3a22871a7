"""The offline pipeline (sort -> DP minibatches -> SA batch groups) and its saved artifact.

``build_schedule`` sorts items by predicted length, splits
them with Algorithm 1, then orders the minibatches with Algorithm 2 on their loads. Loads are
the sums of ``calibrated_lengths`` when given (see :mod:`asp_scheduler.calibration`), else of
the raw predictions. Optionally whole batch groups are shuffled afterwards (a short last group
stays last so every other group keeps exactly ``k`` minibatches).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asp_scheduler.metrics import ScheduleMetrics, segment_metrics
from asp_scheduler.minibatch import DpObjective, fixed_size_endpoints, partition_sorted, validate_sizes
from asp_scheduler.ordering import anneal_order, validate_group_size
from asp_scheduler.predictors.base import PredictorQuality

FORMAT_NAME = "asp_schedule"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleParams:
    b: int = 32
    kappa: int = 2
    k: int = 6
    sa_iterations: int = 2_000_000
    sa_constant: float = 1.0
    seed: int = 0
    dp_objective: str = "utilization"
    normalize: bool = False
    shuffle_groups: bool = False
    allow_small: bool = False


@dataclass(slots=True, kw_only=True)
class Schedule:
    """Minibatches in dispatch order, their batch groups, and how they were obtained."""

    minibatches: list[np.ndarray]
    """Index arrays into ``predicted_lengths``, in dispatch order."""
    batch_group_ids: np.ndarray
    predicted_lengths: np.ndarray
    calibrated_lengths: np.ndarray | None
    item_ids: list[str] | None
    params: ScheduleParams
    num_short_minibatches: int
    sa_variance_reduction: float
    predicted_metrics: ScheduleMetrics
    """Metrics of the lengths that were balanced (calibrated if given, else predicted)."""
    predictor: dict[str, Any] = field(default_factory=dict)
    predictor_quality: PredictorQuality | None = None

    @property
    def predicted_loads(self) -> np.ndarray:
        return np.array([self.predicted_lengths[m].sum() for m in self.minibatches])

    @property
    def calibrated_loads(self) -> np.ndarray | None:
        if self.calibrated_lengths is None:
            return None
        cal = self.calibrated_lengths
        return np.array([cal[m].sum() for m in self.minibatches])

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(_to_json(self)))

    @classmethod
    def load(cls, path: str | Path) -> Schedule:
        return _from_json(json.loads(Path(path).read_text()), source=str(path))


def _check_lengths(values: np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{what} must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{what} must be finite and >= 0; fix NaN/inf/negative entries first")
    return arr


def _shuffle_groups(order: np.ndarray, k: int, seed: int) -> np.ndarray:
    num_full = order.size // k
    perm = np.random.default_rng(seed).permutation(num_full)
    full = order[: num_full * k].reshape(num_full, k)[perm].ravel()
    return np.concatenate([full, order[num_full * k :]])


def build_schedule(
    predicted_lengths: np.ndarray,
    b: int = 32,
    kappa: int = 2,
    k: int = 6,
    sa_iterations: int = 2_000_000,
    sa_constant: float = 1.0,
    seed: int = 0,
    *,
    calibrated_lengths: np.ndarray | None = None,
    item_ids: Sequence[str] | None = None,
    dp_objective: DpObjective = "utilization",
    normalize: bool = False,
    shuffle_groups: bool = False,
    allow_small: bool = False,
    predictor: Mapping[str, Any] | None = None,
    predictor_quality: PredictorQuality | None = None,
) -> Schedule:
    """Run the ASP pipeline on one predicted length per item; see the module docstring."""
    validate_group_size(k)
    pred = _check_lengths(predicted_lengths, "predicted_lengths")
    cal = None if calibrated_lengths is None else _check_lengths(calibrated_lengths, "calibrated_lengths")
    if cal is not None and cal.shape != pred.shape:
        raise ValueError(f"calibrated_lengths has {cal.size} entries but there are {pred.size} items")
    if item_ids is not None and len(item_ids) != pred.size:
        raise ValueError(f"item_ids has {len(item_ids)} entries but there are {pred.size} items")
    params = ScheduleParams(
        b=int(b), kappa=int(kappa), k=int(k), sa_iterations=int(sa_iterations), sa_constant=float(sa_constant),
        seed=int(seed), dp_objective=dp_objective, normalize=normalize, shuffle_groups=shuffle_groups,
        allow_small=allow_small,
    )  # fmt: skip
    # Equal predictions are interchangeable for DP and SA, so a non-stable sort is fine (and 1.7x
    # faster at 10^7); it is still deterministic for a given numpy.
    order = np.argsort(pred)
    partition = partition_sorted(pred[order], b, kappa, objective=dp_objective, allow_small=allow_small)
    ends = partition.endpoints
    balance_on = pred if cal is None else cal
    balance_sorted = balance_on[order]
    loads = np.add.reduceat(balance_sorted, ends[:-1])
    ordering = anneal_order(
        loads, k, num_iterations=sa_iterations, c=sa_constant, seed=seed, normalize=normalize
    )
    dispatch = ordering.permutation
    if shuffle_groups:
        dispatch = _shuffle_groups(dispatch, k, seed)
    sorted_batches = np.split(order, ends[1:-1])
    minibatches = [sorted_batches[m] for m in dispatch]
    return Schedule(
        minibatches=minibatches,
        batch_group_ids=np.arange(len(minibatches), dtype=np.int64) // k,
        predicted_lengths=pred,
        calibrated_lengths=cal,
        item_ids=None if item_ids is None else [str(x) for x in item_ids],
        params=params,
        num_short_minibatches=partition.num_short_minibatches,
        sa_variance_reduction=ordering.variance_reduction,
        predicted_metrics=segment_metrics(balance_sorted, ends, dispatch, k),
        predictor=dict(predictor or {}),
        predictor_quality=predictor_quality,
    )


def fixed_order_schedule(
    predicted_lengths: np.ndarray,
    b: int,
    k: int,
    *,
    item_ids: Sequence[str] | None = None,
    predictor: Mapping[str, Any] | None = None,
    predictor_quality: PredictorQuality | None = None,
) -> Schedule:
    """Condition C0: consecutive size-``b`` minibatches in input order, no sorting and no SA.

    When ``b`` does not divide the item count the last minibatch is shorter (nothing dropped);
    it is counted in ``num_short_minibatches``.
    """
    validate_sizes(b, 0)
    validate_group_size(k)
    pred = _check_lengths(predicted_lengths, "predicted_lengths")
    if item_ids is not None and len(item_ids) != pred.size:
        raise ValueError(f"item_ids has {len(item_ids)} entries but there are {pred.size} items")
    ends = fixed_size_endpoints(pred.size, b)
    num_minibatches = ends.size - 1
    return Schedule(
        minibatches=np.split(np.arange(pred.size, dtype=np.int64), ends[1:-1]),
        batch_group_ids=np.arange(num_minibatches, dtype=np.int64) // k,
        predicted_lengths=pred,
        calibrated_lengths=None,
        item_ids=None if item_ids is None else [str(x) for x in item_ids],
        params=ScheduleParams(b=int(b), kappa=0, k=int(k), sa_iterations=0, allow_small=True),
        num_short_minibatches=int(pred.size % b != 0),
        sa_variance_reduction=0.0,
        predicted_metrics=segment_metrics(pred, ends, np.arange(num_minibatches), k),
        predictor=dict(predictor or {}),
        predictor_quality=predictor_quality,
    )


def _to_json(s: Schedule) -> dict[str, Any]:
    pred_loads = s.predicted_loads
    cal_loads = s.calibrated_loads
    rows = []
    for i, (m, g) in enumerate(zip(s.minibatches, s.batch_group_ids)):
        row: dict[str, Any] = {
            "minibatch_id": i,
            "batch_group_id": int(g),
            "items": m.tolist(),
            "predicted_load": float(pred_loads[i]),
            "calibrated_load": None if cal_loads is None else float(cal_loads[i]),
        }
        if s.item_ids is not None:
            row["prompt_ids"] = [s.item_ids[j] for j in m]
        rows.append(row)
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "params": asdict(s.params),
        "predictor": s.predictor,
        "predictor_quality": None if s.predictor_quality is None else asdict(s.predictor_quality),
        "predicted_metrics": s.predicted_metrics.as_dict(),
        "num_short_minibatches": s.num_short_minibatches,
        "sa_variance_reduction": s.sa_variance_reduction,
        "item_ids": s.item_ids,
        "predicted_lengths": s.predicted_lengths.tolist(),
        "calibrated_lengths": None if s.calibrated_lengths is None else s.calibrated_lengths.tolist(),
        "minibatches": rows,
    }


def _from_json(doc: dict[str, Any], *, source: str) -> Schedule:
    if doc.get("format") != FORMAT_NAME or doc.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{source} is not an {FORMAT_NAME} v{FORMAT_VERSION} file (format={doc.get('format')!r}, "
            f"version={doc.get('version')!r}); regenerate it with `python -m asp_scheduler schedule`"
        )
    quality = doc["predictor_quality"]
    cal = doc["calibrated_lengths"]
    rows = doc["minibatches"]
    return Schedule(
        minibatches=[np.asarray(r["items"], dtype=np.int64) for r in rows],
        batch_group_ids=np.asarray([r["batch_group_id"] for r in rows], dtype=np.int64),
        predicted_lengths=np.asarray(doc["predicted_lengths"], dtype=np.float64),
        calibrated_lengths=None if cal is None else np.asarray(cal, dtype=np.float64),
        item_ids=doc["item_ids"],
        params=ScheduleParams(**doc["params"]),
        num_short_minibatches=int(doc["num_short_minibatches"]),
        sa_variance_reduction=float(doc["sa_variance_reduction"]),
        predicted_metrics=ScheduleMetrics(**doc["predicted_metrics"]),
        predictor=doc["predictor"],
        predictor_quality=None if quality is None else PredictorQuality(**quality),
    )
