"""The learning-rate schedule (``lr_decay_style``, warm-up, ``min_lr``), a pure function of the step.

Megatron's convention: the schedule counts OPTIMIZER steps (one Megatron iteration is one
optimizer step). Here one GRPO iteration takes ``global_batch_size / mini_batch_size x epochs``
optimizer steps, so ``lr_warmup_iters`` and ``lr_decay_iters`` are in optimizer steps, and
``lr_decay_iters: null`` means the whole run (``train_iters`` x optimizer steps per iteration).

    lr
    |      ____________ constant
    |     /  ‾‾‾‾‾‾‾‾‾‾-----___        linear / cosine decay to min_lr at decay_steps,
    |    /                     ‾‾--__  then min_lr
    |   / warm-up (linear from 0)
    +--+---------------------------+----> optimizer step (1-based)
       warmup_steps              decay_steps

One departure from Megatron: its first optimizer step runs at lr 0 under warm-up (the schedule
is read before the step counter moves). Here step s (1-based) gets ``lr * s / warmup_steps``, so
no step is wasted and the last warm-up step reaches the peak exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

DecayStyle = Literal["constant", "linear", "cosine"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LRSchedule:
    lr: float
    """Peak learning rate (reached at the end of warm-up)."""
    min_lr: float = 0.0
    """Floor reached at ``decay_steps`` by linear/cosine decay and kept after it."""
    decay_style: DecayStyle = "constant"
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to ``lr``."""
    decay_steps: int | None = None
    """Optimizer step at which decay reaches ``min_lr``; required for linear/cosine."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"need 0 <= min_lr <= lr; got lr={self.lr}, min_lr={self.min_lr} (actor_config)")
        if self.warmup_steps < 0:
            raise ValueError(
                f"warm-up steps must be >= 0; got {self.warmup_steps} (actor_config.lr_warmup_*)"
            )
        if self.decay_style != "constant" and self.decay_steps is None:
            raise ValueError(
                f"lr_decay_style {self.decay_style} needs decay_steps (actor_config.lr_decay_iters)"
            )
        if self.decay_steps is not None and self.decay_steps < max(self.warmup_steps, 1):
            raise ValueError(
                f"decay over {self.decay_steps} optimizer steps ends before warm-up ({self.warmup_steps} steps); "
                "lower actor_config.lr_warmup_iters / lr_warmup_fraction or raise lr_decay_iters"
            )

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (1-based: the first step is 1)."""
        if step < 1:
            raise ValueError(f"optimizer steps are counted from 1; got {step}")
        if self.warmup_steps and step <= self.warmup_steps:
            return self.lr * step / self.warmup_steps
        if self.decay_style == "constant":
            return self.lr
        assert self.decay_steps is not None
        if step >= self.decay_steps:
            return self.min_lr
        ratio = (step - self.warmup_steps) / (self.decay_steps - self.warmup_steps)
        if self.decay_style == "linear":
            coeff = 1.0 - ratio
        else:
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.lr - self.min_lr)
