"""Render a run's ``metrics.jsonl`` as PNG plots (one figure per metric family)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mindspeed_rl.utils.metrics import read_metrics

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


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, int | float):
            xs.append(float(record["iteration"]))
            ys.append(float(value))
    return xs, ys


def render_plots(
    run_dir: str | Path, out_path: str | Path | None = None, panels: Sequence[Sequence[str]] = DEFAULT_PANELS
) -> Path:
    """Write one PNG with a panel per metric family that the run recorded; return its path."""
    import matplotlib

    matplotlib.use("Agg")  # headless: runs on servers and in CI
    import matplotlib.pyplot as plt

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
