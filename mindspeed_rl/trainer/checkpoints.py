"""Where and when both trainers write their periodic HF checkpoints (``save_interval``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig


def is_save_iteration(config: GRPOConfig, iteration: int) -> bool:
    """True after every ``save_interval``-th iteration (0-based ``iteration``); never when unset."""
    interval = config.megatron_training.training.save_interval
    return interval is not None and interval > 0 and (iteration + 1) % interval == 0


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    """Upstream's folder naming: ``iter_0000100`` after the 100th iteration."""
    return run_dir / "checkpoints" / f"iter_{iteration + 1:07d}"
