"""What one simulated run reports: Table 4b columns, series, measured lag vs Eq. 4, duty cycle."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mindspeed_rl.runtime import EventLog, RuntimeSummary
from mindspeed_rl.runtime.observation import LoopObservation
from mindspeed_rl.runtime.summary import build_summary
from mindspeed_rl.runtime.timings import eq4_d_off_estimate
from mindspeed_rl.sim.table4b import (
    QueueSeries,
    Table4bRow,
    iteration_times,
    queue_depth_series,
    table4b_row,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LagReport:
    d_off_measured_mean: float | None
    """Mean over consumed samples of ``step − generating version`` (exact, from the runtime)."""
    d_off_measured_max: int | None
    q_arrival_mean_global_batches: float
    """Mean Training Queue depth found by arriving minibatches (``Q̄_arrival`` of Eq. 4)."""
    d_off_eq4: float | None
    """Eq. 4 with this run's mean timings and ``Q̄_arrival``."""
    d_off_eq4_runtime_mean: float | None
    """The runtime's own per-arrival Eq. 4 estimates (running means), averaged over steps."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    table4b: Table4bRow
    iteration_seconds: np.ndarray
    queue: QueueSeries
    lag: LagReport
    duty_cycle: float | None
    """Mean over actors of the paper's η = generating ÷ (generating + loading)."""
    busy_fraction: float | None
    """Mean over actors of generating ÷ wall time (also charges idle and paused time)."""
    mean_gen_seconds: float
    std_gen_seconds: float
    mean_train_seconds: float
    summary: RuntimeSummary
    events: EventLog

    def to_dict(self, *, include_series: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "table4b": self.table4b.to_dict(),
            "lag": asdict(self.lag),
            "duty_cycle": self.duty_cycle,
            "busy_fraction": self.busy_fraction,
            "mean_gen_seconds": self.mean_gen_seconds,
            "std_gen_seconds": self.std_gen_seconds,
            "mean_train_seconds": self.mean_train_seconds,
            "summary": self.summary.to_dict(),
        }
        if include_series:
            out["iteration_seconds"] = self.iteration_seconds.tolist()
            out["queue_times"] = self.queue.times.tolist()
            out["queue_depth_samples"] = self.queue.depth_samples.tolist()
        return out


def build_result(
    seen: LoopObservation, events: EventLog, gen_seconds: Sequence[float], *, condition: str = "sim"
) -> SimResult:
    """The result of a finished run from the loop's read-out, its event log and the modeled
    generation times (``gen_seconds``: one per completed minibatch)."""
    summary = build_summary(seen)
    arrivals = seen.arrivals
    q_mean = float(np.mean([a.depth_global_batches_before for a in arrivals])) if arrivals else 0.0
    busy = [a.busy_fraction for a in summary.actors if a.busy_fraction is not None]
    gens = np.array(gen_seconds, dtype=np.float64)
    lag = LagReport(
        d_off_measured_mean=summary.mean_policy_lag_measured,
        d_off_measured_max=summary.max_policy_lag_measured,
        q_arrival_mean_global_batches=q_mean,
        d_off_eq4=None if seen.timings is None else eq4_d_off_estimate(q_mean, seen.timings),
        d_off_eq4_runtime_mean=summary.mean_policy_lag_eq4_estimate,
    )
    log = list(events)
    return SimResult(
        table4b=table4b_row(log, condition=condition, start_time=0.0),
        iteration_seconds=iteration_times(log, start_time=0.0),
        queue=queue_depth_series(log, start_time=0.0),
        lag=lag,
        duty_cycle=summary.mean_duty_cycle,
        busy_fraction=float(np.mean(busy)) if busy else None,
        mean_gen_seconds=float(gens.mean()) if gens.size else 0.0,
        std_gen_seconds=float(gens.std()) if gens.size else 0.0,
        mean_train_seconds=seen.mean_train_seconds or 0.0,
        summary=summary,
        events=events,
    )
