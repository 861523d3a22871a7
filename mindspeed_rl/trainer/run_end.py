"""The block every run ends with: what it did, and where to look next.

    startup.finish(run_dir, lineage)  (where both loops end; any entry point that trains through
        │                              a trainer's train() gets it)
        ├─► write_run_plots(run_dir)          <run>/plots/*.png
        └─► print(end_block(read_run_end()))  from the files the run left, nothing else:
                summary.json (counts, queue, lag, faults), metrics.jsonl (reward, eval, tokens/s)

Reading the files rather than the live trainer keeps the block the same for hybrid, async and a
resumed run, and lets ``end_block`` be checked on a written run directory without Ray.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindspeed_rl.utils.metrics import read_metrics
from mindspeed_rl.utils.plots import PLOTS_DIR, write_run_plots

logger = logging.getLogger(__name__)

EDGE = 5
"""Iterations averaged at each end of the reward curve (one iteration's mean is noisy)."""
# summary.json counters that mean something went wrong or was repaired; shown when non-zero.
FAULT_KEYS = (
    "actor_restarts",
    "actor_deaths",
    "minibatches_reissued",
    "duplicate_minibatches_dropped",
    "minibatch_errors",
    "minibatches_timed_out",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnd:
    run_dir: Path
    pipeline: str
    iterations: tuple[int, ...]
    """The 0-based iterations this run trained (a resumed run starts past 0)."""
    wall_s: float | None
    reward_first: float | None
    reward_last: float | None
    evals: tuple[tuple[int, float], ...]
    """(iteration, eval/accuracy) of every evaluation, in order."""
    tokens_per_s: float | None
    prompts_consumed: int | None
    prompts_scheduled: int | None
    queue_max: int | None
    queue_bound: int | None
    lag_max: int | None
    lag_mean: float | None
    lag_limit: int | None
    faults: Mapping[str, int]
    resumed_from_iteration: int | None
    plots: tuple[Path, ...]
    final_model: Path | None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _number(record: Mapping[str, Any], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def run_wall_seconds(run_dir: Path, now: float | None = None) -> float | None:
    """Seconds since the run directory got its first file (the CLI writes the resolved config
    first), i.e. the whole run as the user waited for it, Ray and engine start-up included."""
    stamps = [p.stat().st_mtime for p in run_dir.iterdir() if p.is_file()]
    first = (
        (run_dir / "config_resolved.json").stat().st_mtime
        if (run_dir / "config_resolved.json").is_file()
        else None
    )
    start = first if first is not None else (min(stamps) if stamps else None)
    return None if start is None else max(0.0, (time.time() if now is None else now) - start)


def read_run_end(run_dir: str | Path, plots: Sequence[Path] = (), now: float | None = None) -> RunEnd:
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    summary: dict[str, Any] = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    metrics_path = run_dir / "metrics.jsonl"
    records = read_metrics(metrics_path) if metrics_path.is_file() else []
    rewards = [v for r in records if (v := _number(r, "reward_mean")) is not None]
    evals = tuple((int(r["iteration"]), v) for r in records if (v := _number(r, "eval/accuracy")) is not None)
    tokens = sum(_number(r, "num_response_tokens") or 0.0 for r in records)
    seconds = sum(_number(r, "iteration_time_s") or 0.0 for r in records)
    final_model = run_dir / "final_model"
    async_run = summary.get("pipeline") == "async"
    return RunEnd(
        run_dir=run_dir,
        pipeline=str(summary.get("pipeline", "?")),
        iterations=tuple(int(r["iteration"]) for r in records),
        wall_s=run_wall_seconds(run_dir, now),
        reward_first=_mean(rewards[:EDGE]),
        reward_last=_mean(rewards[-EDGE:]),
        evals=evals,
        tokens_per_s=tokens / seconds if tokens > 0 and seconds > 0 else None,
        prompts_consumed=summary.get("prompts_consumed_total", summary.get("prompts_consumed")),
        prompts_scheduled=summary.get("prompts_scheduled"),
        queue_max=summary.get("max_queue_depth_samples") if async_run else None,
        queue_bound=summary.get("queue_bound_samples", summary.get("queue_limit_samples")),
        lag_max=summary.get("max_policy_lag_measured"),
        lag_mean=summary.get("mean_policy_lag_measured"),
        lag_limit=summary.get("max_policy_lag_limit"),
        faults={k: int(summary[k]) for k in FAULT_KEYS if summary.get(k)},
        resumed_from_iteration=summary.get("resumed_from_iteration"),
        plots=tuple(plots),
        final_model=final_model if final_model.is_dir() else None,
    )


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def _arrow(first: float | None, last: float | None) -> str:
    if first is None or last is None:
        return "not recorded"
    return f"{first:.3f} -> {last:.3f} ({last - first:+.3f})"


def end_block(end: RunEnd) -> str:
    """The lines printed when a run ends (no trailing newline)."""
    its = end.iterations
    span = f"{len(its)} iterations ({its[0]}-{its[-1]})" if its else "no iterations"
    resumed = (
        f", resumed from iteration {end.resumed_from_iteration}"
        if end.resumed_from_iteration is not None
        else ""
    )
    wall = f" in {_duration(end.wall_s)}" if end.wall_s is not None else ""
    n = min(EDGE, len(its))
    lines = [
        f"== run finished: {end.run_dir}",
        f"   {end.pipeline} pipeline, {span}{wall}{resumed}",
        f"   reward         {_arrow(end.reward_first, end.reward_last)}   mean of the first {n} -> last {n} iterations",
    ]
    if end.evals:
        (i0, a0), (i1, a1) = end.evals[0], end.evals[-1]
        lines.append(
            f"   eval accuracy  {a0:.3f} -> {a1:.3f} ({a1 - a0:+.3f})   held-out, after iteration {i0} -> {i1}"
        )
    else:
        lines.append("   eval accuracy  none (set megatron_training.eval_interval and a valid split)")
    if end.tokens_per_s is not None:
        lines.append(f"   tokens/s       {end.tokens_per_s:,.0f}   response tokens over training-loop time")
    if end.prompts_consumed is not None:
        lines.append(
            f"   prompts        {end.prompts_consumed} consumed of {end.prompts_scheduled} scheduled"
        )
    if end.queue_max is not None:
        lines.append(f"   queue max      {end.queue_max} samples (bound {end.queue_bound})")
    if end.lag_max is not None:
        mean = f", mean {end.lag_mean:.2f}" if isinstance(end.lag_mean, int | float) else ""
        limit = f" (limit {end.lag_limit})" if end.lag_limit is not None else ""
        lines.append(f"   policy lag     max {end.lag_max}{mean}{limit} versions, measured")
    faults = ", ".join(f"{k}={v}" for k, v in end.faults.items()) or "none"
    lines.append(f"   restarts/faults {faults}")
    lines.append(f"   summary        {end.run_dir / 'summary.json'}")
    if end.plots:
        names = " ".join(p.name for p in end.plots)
        lines.append(f"   plots          {end.run_dir / PLOTS_DIR}/  {names}")
    if end.final_model is not None:
        lines.append(f"   final model    {end.final_model}")
    return "\n".join(lines)


def report_run_end(run_dir: str | Path) -> str:
    """Write the plots and print the end block; returns the block. A plotting failure is logged
    and skipped: the run itself is done and its files are written."""
    run_dir = Path(run_dir)
    try:
        plots = write_run_plots(run_dir)
    except Exception:
        logger.exception("plots for %s could not be written; the run's files are complete", run_dir)
        plots = []
    block = end_block(read_run_end(run_dir, plots))
    print(block, flush=True)
    return block


def plots_at_checkpoint(run_dir: str | Path) -> None:
    """The curves so far, beside a checkpoint just written; a failure is logged, never fatal."""
    try:
        write_run_plots(run_dir)
    except Exception:
        logger.exception("plots for %s could not be written at this checkpoint", run_dir)
