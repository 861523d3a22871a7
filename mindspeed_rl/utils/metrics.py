"""Metric sinks for a run directory: ``metrics.jsonl`` (always), TensorBoard (optional), console.

One record per training iteration. Records are flat ``{name: number}`` dicts plus ``iteration``;
nested per-GU / per-actor breakdowns are flattened with ``/`` so TensorBoard groups them.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

Scalar = int | float


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """Flatten nested mappings to ``a/b/c`` keys, keeping only finite-or-not numbers (bools → int)."""
    flat: dict[str, Scalar] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, prefix=f"{name}/"))
        elif isinstance(value, bool):
            flat[name] = int(value)
        elif isinstance(value, int | float):
            flat[name] = value
        else:
            raise TypeError(f"metric {name!r} has non-numeric value {value!r} ({type(value).__name__})")
    return flat


class MetricsWriter:
    """Appends per-iteration metrics to ``<run_dir>/metrics.jsonl`` and, if asked, TensorBoard."""

    def __init__(self, run_dir: str | Path, *, use_tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._tb: Any = None
        if use_tensorboard:
            # Imported lazily: tensorboard pulls in a lot and is optional for library users.
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        self._start = time.monotonic()

    def write(self, iteration: int, metrics: Mapping[str, Any]) -> dict[str, Scalar]:
        record: dict[str, Scalar] = {"iteration": iteration, **flatten(metrics)}
        # JSON has no NaN/inf; write null so downstream readers do not choke.
        safe = {
            k: (v if not (isinstance(v, float) and not math.isfinite(v)) else None) for k, v in record.items()
        }
        self._file.write(json.dumps(safe, sort_keys=True) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "iteration":
                    self._tb.add_scalar(key, value, global_step=iteration)
        return record

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def format_progress(record: Mapping[str, Scalar], total_iters: int, keys: tuple[str, ...]) -> str:
    """One console line per iteration: ``[it 3/30] reward_mean=0.412 ...``."""
    parts = [f"[it {int(record['iteration'])}/{total_iters}]"]
    for key in keys:
        if key in record:
            value = record[key]
            parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(parts)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` back (used by plots, benchmarks and tests)."""
    with Path(path).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
