"""The paper's Table 4b columns, computed from a ControlLoop event log.

Both the simulator and the real pipeline (trace replay) drive the same ``ControlLoop``, whose
``EventLog`` records every accepted minibatch, global-batch pop and finished trainer step. Computing
the columns from that log alone means the simulated and the replayed runs are measured by the same
code, with the same definitions:

* iteration time ``i`` = end of trainer step ``i`` − end of step ``i − 1`` (step 0 counts from the
  run start, so the first iteration includes pipeline warm-up, as the paper's means do);
* trend = Spearman correlation of iteration time against iteration index (``scipy.stats.spearmanr``;
  NaN when the iteration times are all equal, where a rank correlation is undefined);
* Training Queue depth (samples) is the step function rebuilt from accepted arrivals (+) and
  global-batch pops (−); its STD is time-weighted over the run (the paper does not say how it
  sampled the queue; weighting by time keeps a burst of arrivals from counting more than a long
  steady stretch) and its max is the largest depth ever reached.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mindspeed_rl.runtime.events import Event, GlobalBatchPopped, MinibatchReceived, TrainStepDone


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueSeries:
    times: np.ndarray
    """Change points (seconds since the run start), non-decreasing; the first is 0."""
    depth_samples: np.ndarray
    """Depth right after each change point (samples)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Table4bRow:
    condition: str
    num_iterations: int
    mean_iteration_seconds: float
    iteration_trend_spearman: float
    queue_std_samples: float
    queue_max_samples: int
    queue_mean_samples: float
    total_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_start(events: Sequence[Event]) -> float:
    if not events:
        raise ValueError("the event log is empty; run the pipeline before computing Table 4b.")
    return min(e.time for e in events)


def iteration_times(events: Iterable[Event], *, start_time: float) -> np.ndarray:
    ends = sorted((e.step, e.time) for e in events if isinstance(e, TrainStepDone))
    steps = [s for s, _ in ends]
    if steps != list(range(len(steps))):
        raise ValueError(f"trainer steps in the log are not 0..N-1 (got {steps[:5]}...); pass the whole log.")
    times = np.array([start_time] + [t for _, t in ends], dtype=np.float64)
    return np.diff(times)


def queue_depth_series(events: Iterable[Event], *, start_time: float) -> QueueSeries:
    times, depths, depth = [0.0], [0], 0
    for e in events:
        if isinstance(e, MinibatchReceived) and e.outcome == "accepted":
            depth += e.num_samples
        elif isinstance(e, GlobalBatchPopped):
            depth -= e.num_samples
        else:
            continue
        assert depth >= 0, "a global batch took more samples than had arrived"
        times.append(e.time - start_time)
        depths.append(depth)
    order = np.argsort(np.array(times), kind="stable")
    return QueueSeries(
        times=np.array(times, dtype=np.float64)[order], depth_samples=np.array(depths, dtype=np.int64)[order]
    )


def time_weighted_stats(series: QueueSeries, *, end_time: float) -> tuple[float, float]:
    """``(mean, std)`` of the step function over ``[0, end_time]``."""
    edges = np.append(series.times, max(end_time, float(series.times[-1])))
    weights = np.diff(edges)
    if weights.sum() <= 0:
        return float(series.depth_samples[-1]), 0.0
    mean = float(np.average(series.depth_samples, weights=weights))
    var = float(np.average((series.depth_samples - mean) ** 2, weights=weights))
    return mean, var**0.5


def spearman_trend(values: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if values.size < 2 or np.all(values == values[0]):
        return float("nan")
    return float(spearmanr(np.arange(values.size), values).statistic)


def table4b_row(
    events: Sequence[Event], *, condition: str, start_time: float | None = None, skip_first: int = 0
) -> Table4bRow:
    """The Table 4b columns of one run; ``skip_first`` drops warm-up iterations from mean and trend."""
    start = run_start(events) if start_time is None else start_time
    iters = iteration_times(events, start_time=start)
    if skip_first < 0 or iters.size <= skip_first:
        raise ValueError(f"skip_first={skip_first} leaves no iterations out of {iters.size}; lower it.")
    kept = iters[skip_first:]
    total = float(iters.sum())
    series = queue_depth_series(events, start_time=start)
    mean_depth, std_depth = time_weighted_stats(series, end_time=total)
    return Table4bRow(
        condition=condition,
        num_iterations=int(kept.size),
        mean_iteration_seconds=float(kept.mean()),
        iteration_trend_spearman=spearman_trend(kept),
        queue_std_samples=std_depth,
        queue_max_samples=int(series.depth_samples.max()),
        queue_mean_samples=mean_depth,
        total_seconds=total,
    )


def format_table(rows: Sequence[Table4bRow]) -> str:
    """Markdown table in the paper's column order."""
    lines = [
        "| condition | iterations | mean iteration (s) | Spearman trend | queue STD (samples) | queue max (samples) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.condition} | {r.num_iterations} | {r.mean_iteration_seconds:.2f} | "
            f"{r.iteration_trend_spearman:+.3f} | {r.queue_std_samples:.1f} | {r.queue_max_samples} |"
        )
    return "\n".join(lines)
