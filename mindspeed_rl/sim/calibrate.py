"""Calibrate the simulator's timing profile from one real pipeline run (a trace-replay condition).

A replay run directory holds everything a profile needs, measured under the run's own contention
(actors and trainer sharing the host), which a standalone engine benchmark would miss:

* ``replay_plan.json``: every minibatch's forced response lengths (``sim.replay.write_plan``);
* ``events.jsonl``: each accepted minibatch's ``generation_seconds`` (the actor's ``generate``
  call), snapshot save / convert / reload durations;
* ``metrics.jsonl``: per trainer step, the iteration time and the time spent waiting for a batch.

Decode is fitted per minibatch as ``seconds ~ c + a · L_max + b · Σ L`` (``sim.fit``, unweighted:
the simulator needs the total generation time right, not each minibatch's); the train
step is the median of the trainer's busy time (iteration minus waiting: the simulated step plus
the real export, queue pop and control-plane round trips); the weight flow is the median of
each stage. Medians, because a shared host produces occasional multi-second outliers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindspeed_rl.runtime.events import (
    Event,
    MinibatchReceived,
    SnapshotConverted,
    SnapshotPublished,
    WeightsLoaded,
)
from mindspeed_rl.sim.fit import DecodeFit, DecodeRun, fit_decode
from mindspeed_rl.sim.replay import read_events, read_plan_lengths
from mindspeed_rl.sim.timing import TimingProfile, TrainModel, WeightFlowModel
from mindspeed_rl.utils.metrics import read_metrics


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    profile: TimingProfile
    decode_fit: DecodeFit
    num_train_steps: int
    num_snapshots: int
    num_reloads: int
    source: str
    unmeasured: tuple[str, ...] = ()
    """Weight-flow stages the runs never exercised (too short to export or reload); modelled as 0 s."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "decode_fit": self.decode_fit.to_dict(),
            "train_seconds": self.profile.train.per_step_seconds,
            "weight_flow": {
                "save_seconds": self.profile.weight_flow.save_seconds,
                "convert_seconds": self.profile.weight_flow.convert_seconds,
                "load_seconds": self.profile.weight_flow.load_seconds,
            },
            "num_train_steps": self.num_train_steps,
            "num_snapshots": self.num_snapshots,
            "num_reloads": self.num_reloads,
            "unmeasured": list(self.unmeasured),
        }

    def profile_yaml(self) -> str:
        """The ``profile:`` block of a preset (``configs/sim/*.yaml``)."""
        d, t, w = self.profile.decode, self.profile.train, self.profile.weight_flow
        return "\n".join(
            [
                f"profile:  # calibrated from {self.source}",
                "  decode:",
                f"    per_step_seconds: {d.per_step_seconds:.6g}",
                f"    per_token_seconds: {d.per_token_seconds:.6g}",
                f"    per_minibatch_seconds: {d.per_minibatch_seconds:.6g}",
                "  train:",
                f"    per_step_seconds: {t.per_step_seconds:.6g}",
                "  weight_flow:",
                f"    save_seconds: {w.save_seconds:.6g}",
                f"    convert_seconds: {w.convert_seconds:.6g}",
                f"    load_seconds: {w.load_seconds:.6g}",
            ]
        )


def minibatch_decode_runs(events: Sequence[Event], lengths: Mapping[int, np.ndarray]) -> list[DecodeRun]:
    """One ``DecodeRun`` per accepted minibatch: its size, longest and total length, and time."""
    runs = []
    for e in events:
        if not isinstance(e, MinibatchReceived) or e.outcome != "accepted":
            continue
        if e.minibatch_id not in lengths:
            raise ValueError(
                f"minibatch {e.minibatch_id} is in the event log but not in the plan; "
                "pass the events and the plan of the same run."
            )
        row = lengths[e.minibatch_id]
        if row.size != e.num_samples:
            raise ValueError(
                f"minibatch {e.minibatch_id}: the plan has {row.size} samples but the run returned "
                f"{e.num_samples}; the plan does not belong to this run."
            )
        runs.append(
            DecodeRun(
                batch_size=int(row.size),
                num_steps=float(row.max()),
                seconds=e.generation_seconds,
                sum_tokens=float(row.sum()),
            )
        )
    return runs


def trainer_busy_seconds(metrics: Sequence[Mapping[str, float]]) -> np.ndarray:
    """Per step, iteration time minus the wait for a global batch."""
    keys = ("iteration_time_s", "time/trainer_wait_s")
    missing = [k for k in keys if metrics and k not in metrics[0]]
    if not metrics or missing:
        raise ValueError(
            f"metrics.jsonl needs {keys} per step (written by the async trainer); missing {missing}."
        )
    return np.array([m["iteration_time_s"] - m["time/trainer_wait_s"] for m in metrics], dtype=np.float64)


def _median(values: Sequence[float]) -> float:
    """0 for a stage the runs never exercised (``Calibration.unmeasured`` names it)."""
    return float(np.median(np.asarray(values, dtype=np.float64))) if values else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTimings:
    """What one run contributes to a calibration."""

    decode_runs: list[DecodeRun]
    busy_seconds: np.ndarray
    save_seconds: list[float]
    convert_seconds: list[float]
    load_seconds: list[float]


def run_timings(
    events: Sequence[Event], lengths: Mapping[int, np.ndarray], metrics: Sequence[Mapping[str, float]]
) -> RunTimings:
    return RunTimings(
        decode_runs=minibatch_decode_runs(events, lengths),
        busy_seconds=trainer_busy_seconds(metrics),
        save_seconds=[
            e.save_seconds for e in events if isinstance(e, SnapshotPublished) and e.save_seconds is not None
        ],
        convert_seconds=[e.seconds for e in events if isinstance(e, SnapshotConverted)],
        load_seconds=[e.seconds for e in events if isinstance(e, WeightsLoaded)],
    )


def calibrate(timings: Sequence[RunTimings], *, source: str, fit_overhead: bool = True) -> Calibration:
    """Pool one or more runs' timings into a profile (fit over all minibatches, medians over all)."""
    if not timings:
        raise ValueError("calibrate needs at least one run's timings.")
    decode = fit_decode(
        [r for t in timings for r in t.decode_runs], fit_overhead=fit_overhead, relative=False
    )
    busy = np.concatenate([t.busy_seconds for t in timings])
    saves = [x for t in timings for x in t.save_seconds]
    converts = [x for t in timings for x in t.convert_seconds]
    loads = [x for t in timings for x in t.load_seconds]
    stages = {"save_seconds": saves, "convert_seconds": converts, "load_seconds": loads}
    profile = TimingProfile(
        decode=decode.model,
        train=TrainModel(per_step_seconds=float(np.median(busy))),
        weight_flow=WeightFlowModel(
            save_seconds=_median(saves),
            convert_seconds=_median(converts),
            load_seconds=_median(loads),
        ),
    )
    return Calibration(
        profile=profile,
        decode_fit=decode,
        num_train_steps=int(busy.size),
        num_snapshots=len(saves),
        num_reloads=len(loads),
        source=source,
        unmeasured=tuple(name for name, values in stages.items() if not values),
    )


def calibrate_events(
    events: Sequence[Event],
    lengths: Mapping[int, np.ndarray],
    metrics: Sequence[Mapping[str, float]],
    *,
    source: str,
    fit_overhead: bool = True,
) -> Calibration:
    return calibrate([run_timings(events, lengths, metrics)], source=source, fit_overhead=fit_overhead)


def read_run_timings(run_dir: str | Path) -> RunTimings:
    """One replay condition's run directory (``runs/<replay>/<condition>``)."""
    folder = Path(run_dir)
    metrics_path = folder / "metrics.jsonl"
    if not metrics_path.is_file():
        raise ValueError(f"{metrics_path} does not exist; pass a finished replay condition's run directory.")
    return run_timings(
        read_events(folder / "events.jsonl"), read_plan_lengths(folder), read_metrics(metrics_path)
    )


def calibrate_run_dirs(run_dirs: Sequence[str | Path], *, fit_overhead: bool = True) -> Calibration:
    """Calibrate from one or more replay conditions' run directories, pooled."""
    return calibrate(
        [read_run_timings(d) for d in run_dirs],
        source=", ".join(str(d) for d in run_dirs),
        fit_overhead=fit_overhead,
    )
