"""Metric sinks for a run directory: ``metrics.jsonl`` (always), TensorBoard and W&B (optional), console.

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

from mindspeed_rl.utils.logging_config import LoggingConfig

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
    """Appends per-iteration metrics to ``<run_dir>/metrics.jsonl`` and, as configured, to
    TensorBoard and W&B. ``should_log`` is the console-line decision (``log_interval``)."""

    def __init__(
        self,
        run_dir: str | Path,
        logging_config: LoggingConfig | None = None,
        *,
        use_tensorboard: bool | None = None,
    ) -> None:
        """``use_tensorboard=`` is the pre-LoggingConfig form, kept until every trainer passes a
        LoggingConfig; giving both is an error."""
        if logging_config is not None and use_tensorboard is not None:
            raise ValueError("pass either a LoggingConfig or use_tensorboard=, not both")
        if logging_config is None:
            logging_config = LoggingConfig(
                use_tensorboard=True if use_tensorboard is None else use_tensorboard
            )
        if logging_config.log_interval < 1:
            raise ValueError(
                f"megatron_training.log_interval={logging_config.log_interval}; use 1 (every iteration) or more"
            )
        self.logging = logging_config
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._tb: Any = None
        if logging_config.use_tensorboard:
            # Imported lazily: tensorboard pulls in a lot and is optional for library users.
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        self._wandb: Any = _start_wandb(logging_config, self.run_dir) if logging_config.use_wandb else None
        self._start = time.monotonic()

    def should_log(self, iteration: int) -> bool:
        """Whether iteration ``iteration`` (0-based) gets a console line: every ``log_interval``-th,
        counting from 1 as Megatron does (interval 10 -> iterations 9, 19, ...)."""
        return (iteration + 1) % self.logging.log_interval == 0

    def write(self, iteration: int, metrics: Mapping[str, Any]) -> dict[str, Scalar]:
        record: dict[str, Scalar] = {"iteration": iteration, **flatten(metrics)}
        # JSON has no NaN/inf; write null so downstream readers do not choke.
        safe = {
            k: (v if not (isinstance(v, float) and not math.isfinite(v)) else None) for k, v in record.items()
        }
        self._file.write(json.dumps(safe, sort_keys=True) + "\n")
        self._file.flush()
        scalars = {k: v for k, v in record.items() if k != "iteration"}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, global_step=iteration)
        if self._wandb is not None:
            self._wandb.log(scalars, step=iteration)
        return record

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _start_wandb(config: LoggingConfig, run_dir: Path) -> Any:
    """A W&B run; its files go under ``wandb_save_dir`` (default: the run dir), in a ``wandb/``
    folder W&B creates there. With no network, set ``WANDB_MODE=offline`` and sync later."""
    try:
        import wandb
    except ImportError as exc:
        raise ValueError(
            "rl_config.use_wandb is true but wandb is not installed; run `pip install wandb` "
            "(or set rl_config.use_wandb: false)"
        ) from exc
    directory = Path(config.wandb_save_dir) if config.wandb_save_dir else run_dir
    directory.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        project=config.wandb_project,
        name=config.wandb_exp_name or run_dir.name,
        dir=str(directory),
    )


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
