"""Render a run's ``metrics.jsonl`` as PNG plots.

    write_run_plots(run_dir)  <run>/plots/<name>.png, one figure per question a user asks of a run
                              (reward, eval accuracy, tokens/s, queue depth, lag, per-GU duty
                              cycle); a figure whose metrics the run did not record is skipped.
                              Both trainers call it at the end of a run and at each checkpoint.
    render_plots(run_dir)     one PNG with a panel per metric family (``cli/plot_metrics.py --out``)

matplotlib runs with the Agg backend (no display needed); it is imported on first use only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindspeed_rl.utils.metrics import read_metrics

PLOTS_DIR = "plots"
# Metric families worth a panel each, when present; anything else is plotted only if asked for.
DEFAULT_PANELS: tuple[tuple[str, ...], ...] = (
    ("reward_mean",),
    ("response_length_mean", "response_length_max"),
    ("tokens_per_s",),
    ("iteration_time_s",),
    ("queue/depth_samples_max", "queue/depth_samples_mean"),
    ("lag/d_off_mean", "lag/d_off_max", "lag/d_off_eq4"),
    ("duty_cycle_mean",),
)
_ACTOR_DUTY = re.compile(r"^duty_cycle/actor(\d+)_(\d+)$")
Series = tuple[list[float], list[float]]


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    """File stem under ``<run>/plots/``."""
    title: str
    ylabel: str
    lines: Callable[[Sequence[dict[str, Any]]], dict[str, Series]]
    """label -> (iterations, values); empty when the run did not record the metric."""


def _series(records: Sequence[dict[str, Any]], key: str) -> Series:
    xs, ys = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            xs.append(float(record["iteration"]))
            ys.append(float(value))
    return xs, ys


def _keys(*keys: str) -> Callable[[Sequence[dict[str, Any]]], dict[str, Series]]:
    def lines(records: Sequence[dict[str, Any]]) -> dict[str, Series]:
        found = {key: _series(records, key) for key in keys}
        return {key: s for key, s in found.items() if s[0]}

    return lines


def rolling_mean(values: Sequence[float], window: int = 5) -> list[float]:
    """Trailing mean over up to ``window`` values: the trend through per-iteration noise."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i + 1 - window) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def _reward(records: Sequence[dict[str, Any]]) -> dict[str, Series]:
    xs, ys = _series(records, "reward_mean")
    if not xs:
        return {}
    return {"reward_mean": (xs, ys), "5-iteration mean": (xs, rolling_mean(ys))}


def gu_duty_cycles(records: Sequence[dict[str, Any]]) -> dict[str, Series]:
    """Per Generation Unit: the mean of its actors' ``duty_cycle/actor<g>_<a>`` per iteration."""
    by_gu: dict[int, dict[float, list[float]]] = {}
    for record in records:
        for key, value in record.items():
            match = _ACTOR_DUTY.match(key)
            if match and isinstance(value, int | float):
                by_gu.setdefault(int(match.group(1)), {}).setdefault(float(record["iteration"]), []).append(
                    float(value)
                )
    return {
        f"GU {gu}": (list(points), [sum(v) / len(v) for v in points.values()])
        for gu, points in sorted(by_gu.items())
    }


FIGURES: tuple[Figure, ...] = (
    Figure("reward", "training reward (sampled rollouts)", "reward", _reward),
    Figure(
        "eval_accuracy",
        "held-out evaluation",
        "accuracy / reward",
        _keys("eval/accuracy", "eval/reward_mean"),
    ),
    Figure("tokens_per_s", "throughput", "response tokens / s", _keys("tokens_per_s")),
    Figure(
        "queue_depth",
        "Training Queue depth",
        "samples",
        _keys("queue/depth_samples_max", "queue/depth_samples_mean"),
    ),
    Figure(
        "lag", "policy lag of trained samples", "versions behind", _keys("lag/d_off_mean", "lag/d_off_max")
    ),
    Figure("duty_cycle", "duty cycle per Generation Unit", "busy fraction", gu_duty_cycles),
)


def write_run_plots(run_dir: str | Path) -> list[Path]:
    """Write ``<run>/plots/*.png`` from the run's metrics; returns the files written (none when
    there is no ``metrics.jsonl`` yet). Each PNG is written whole, then renamed into place."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return []
    records = read_metrics(metrics)
    bound = _queue_bound(run_dir)
    plt = _pyplot()
    out_dir = run_dir / PLOTS_DIR
    out_dir.mkdir(exist_ok=True)
    written = []
    for figure in FIGURES:
        lines = figure.lines(records)
        if not lines:
            continue
        fig, ax = plt.subplots(figsize=(7, 3.4))
        for label, (xs, ys) in lines.items():
            ax.plot(xs, ys, marker="." if len(xs) < 80 else None, label=label)
        if figure.name == "queue_depth" and bound is not None:
            ax.axhline(bound, color="grey", linestyle="--", label=f"bound {bound}")
        ax.set(title=f"{figure.title} - {run_dir.name}", xlabel="iteration", ylabel=figure.ylabel)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{figure.name}.png"
        tmp = out_dir / f".{figure.name}.tmp.png"
        fig.savefig(tmp, dpi=100)
        plt.close(fig)
        tmp.replace(path)
        written.append(path)
    return written


def _queue_bound(run_dir: Path) -> int | None:
    """The queue's sample bound, from ``summary.json`` (end of run) or the resolved config."""
    for name, key in (("summary.json", "queue_limit_samples"), ("config_resolved.json", None)):
        path = run_dir / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        value = data.get(key) if key else (data.get("async_config") or {}).get("queue_max_samples")
        if isinstance(value, int):
            return value
    return None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # headless: runs on servers and in CI
    import matplotlib.pyplot as plt

    return plt


def render_plots(
    run_dir: str | Path, out_path: str | Path | None = None, panels: Sequence[Sequence[str]] = DEFAULT_PANELS
) -> Path:
    """Write one PNG with a panel per metric family that the run recorded; return its path."""
    plt = _pyplot()
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise ValueError(f"{metrics_path} not found: pass the run directory that holds metrics.jsonl")
    records = read_metrics(metrics_path)
    present = [tuple(k for k in panel if _series(records, k)[0]) for panel in panels]
    present = [panel for panel in present if panel]
    if not present:
        raise ValueError(f"{metrics_path} has none of the plotted metrics: {[k for p in panels for k in p]}")
    fig, axes = plt.subplots(len(present), 1, figsize=(8, 2.6 * len(present)), sharex=True, squeeze=False)
    for ax, panel in zip(axes[:, 0], present):
        for key in panel:
            ax.plot(*_series(records, key), marker=".", label=key)
        ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("iteration")
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = Path(out_path) if out_path is not None else run_dir / "metrics.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
