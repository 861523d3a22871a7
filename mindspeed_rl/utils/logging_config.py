"""Where and how often a run's metrics are reported (torch-free; built by the config mapper)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggingConfig:
    log_interval: int = 1
    """Iterations between console lines (``metrics.jsonl`` always gets every iteration)."""
    use_tensorboard: bool = True
    use_wandb: bool = False
    wandb_project: str | None = None
    wandb_exp_name: str | None = None
    wandb_save_dir: str | None = None
    """W&B's local folder; null = <run dir>/wandb. ``WANDB_MODE=offline`` works with no network."""
