"""The offline pipeline (sort -> DP minibatches -> SA batch groups) and its saved artifact.

``build_schedule(predicted_lengths, ScheduleParams(...))`` sorts items by predicted length, splits
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

from asp_scheduler.metrics import ScheduleMetrics, schedule_metrics, segment_metrics
from asp_scheduler.minibatch import fixed_size_endpoints, partition_sorted
from asp_scheduler.ordering import anneal_order
from asp_scheduler.params import PAPER_DEFAULTS, ScheduleParams
from asp_scheduler.predictors.base import PredictorQuality

FORMAT_NAME = "asp_schedule"
FORMAT_VERSION = 1


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


def batch_group_ids(num_minibatches: int, k: int) -> np.ndarray:
    """The one batch-group rule: ``k`` consecutive minibatches of the dispatch order form a group."""
    return np.arange(num_minibatches, dtype=np.int64) // k


def _check_items(pred: np.ndarray, item_ids: Sequence[str] | None) -> list[str] | None:
    if item_ids is not None and len(item_ids) != pred.size:
        raise ValueError(f"item_ids has {len(item_ids)} entries but there are {pred.size} items")
    return None if item_ids is None else [str(x) for x in item_ids]


def _check_calibration(
    params: ScheduleParams, calibrated_lengths: np.ndarray | None, pred: np.ndarray
) -> np.ndarray | None:
    # The saved params must say how the loads were balanced, so the flag and the array must agree.
    if params.calibrate_loads != (calibrated_lengths is not None):
        raise ValueError(
            f"params.calibrate_loads={params.calibrate_loads} but calibrated_lengths "
            f"{'was not' if calibrated_lengths is None else 'was'} given; pass calibrated_lengths together "
            "with ScheduleParams(calibrate_loads=True), or neither"
        )
    if calibrated_lengths is None:
        return None
    cal = _check_lengths(calibrated_lengths, "calibrated_lengths")
    if cal.shape != pred.shape:
        raise ValueError(f"calibrated_lengths has {cal.size} entries but there are {pred.size} items")
    return cal


def build_schedule(
    predicted_lengths: np.ndarray,
    params: ScheduleParams = PAPER_DEFAULTS,
    *,
    calibrated_lengths: np.ndarray | None = None,
    item_ids: Sequence[str] | None = None,
    predictor: Mapping[str, Any] | None = None,
    predictor_quality: PredictorQuality | None = None,
) -> Schedule:
    """Run the ASP pipeline on one predicted length per item; see the module docstring.

    ``calibrated_lengths`` (one per item) are the loads SA balances; give them exactly when
    ``params.calibrate_loads`` is set.
    """
    if not isinstance(params, ScheduleParams):
        raise ValueError(
            f"params must be a ScheduleParams, got {type(params).__name__}; e.g. "
            "build_schedule(lengths, ScheduleParams(b=32, k=6))"
        )
    pred = _check_lengths(predicted_lengths, "predicted_lengths")
    cal = _check_calibration(params, calibrated_lengths, pred)
    ids = _check_items(pred, item_ids)
    # Equal predictions are interchangeable for DP and SA, so a non-stable sort is fine (and 1.7x
    # faster at 10^7); it is still deterministic for a given numpy.
    order = np.argsort(pred)
    partition = partition_sorted(
        pred[order], params.b, params.kappa, objective=params.dp_objective, allow_small=params.allow_small
    )
    ends = partition.endpoints
    balance_sorted = (pred if cal is None else cal)[order]
    loads = np.add.reduceat(balance_sorted, ends[:-1])
    ordering = anneal_order(
        loads,
        params.k,
        num_iterations=params.sa_iterations,
        c=params.sa_constant,
        seed=params.seed,
        normalize=params.normalize,
    )
    dispatch = ordering.permutation
    if params.shuffle_groups:
        dispatch = _shuffle_groups(dispatch, params.k, params.seed)
    sorted_batches = np.split(order, ends[1:-1])
    minibatches = [sorted_batches[m] for m in dispatch]
    return Schedule(
        minibatches=minibatches,
        batch_group_ids=batch_group_ids(len(minibatches), params.k),
        predicted_lengths=pred,
        calibrated_lengths=cal,
        item_ids=ids,
        params=params,
        num_short_minibatches=partition.num_short_minibatches,
        sa_variance_reduction=ordering.variance_reduction,
        predicted_metrics=segment_metrics(balance_sorted, ends, dispatch, params.k),
        predictor=dict(predictor or {}),
        predictor_quality=predictor_quality,
    )


def ordered_schedule(
    predicted_lengths: np.ndarray,
    minibatches: Sequence[np.ndarray],
    params: ScheduleParams,
    *,
    item_ids: Sequence[str] | None = None,
    predictor: Mapping[str, Any] | None = None,
    predictor_quality: PredictorQuality | None = None,
) -> Schedule:
    """A ``Schedule`` for minibatches whose dispatch order was chosen elsewhere (ablation C1-C3).

    No DP and no SA run; groups follow :func:`batch_group_ids`. Short minibatches are those
    under ``params.b`` items.
    """
    pred = _check_lengths(predicted_lengths, "predicted_lengths")
    ids = _check_items(pred, item_ids)
    batches = [np.asarray(m, dtype=np.int64) for m in minibatches]
    covered = np.sort(np.concatenate(batches)) if batches else np.empty(0, dtype=np.int64)
    if not np.array_equal(covered, np.arange(pred.size)):
        raise ValueError(
            f"the minibatches must list every one of the {pred.size} items exactly once; they list "
            f"{covered.size} slots"
        )
    return Schedule(
        minibatches=batches,
        batch_group_ids=batch_group_ids(len(batches), params.k),
        predicted_lengths=pred,
        calibrated_lengths=None,
        item_ids=ids,
        params=params,
        num_short_minibatches=sum(len(m) < params.b for m in batches),
        sa_variance_reduction=0.0,
        predicted_metrics=schedule_metrics(pred, batches, params.k),
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
    params = ScheduleParams(b=b, kappa=0, k=k, sa_iterations=0, allow_small=True)
    pred = _check_lengths(predicted_lengths, "predicted_lengths")
    ends = fixed_size_endpoints(pred.size, b)
    return ordered_schedule(
        pred,
        np.split(np.arange(pred.size, dtype=np.int64), ends[1:-1]),
        params,
        item_ids=item_ids,
        predictor=predictor,
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
        params=ScheduleParams.from_mapping(doc["params"], where=f"{source} params"),
        num_short_minibatches=int(doc["num_short_minibatches"]),
        sa_variance_reduction=float(doc["sa_variance_reduction"]),
        predicted_metrics=ScheduleMetrics(**doc["predicted_metrics"]),
        predictor=doc["predictor"],
        predictor_quality=None if quality is None else PredictorQuality(**quality),
    )
