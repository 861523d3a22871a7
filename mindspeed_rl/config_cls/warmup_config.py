"""``warmup_config``: optional SFT warm-up of a freshly created model on the task's references."""

from __future__ import annotations

from dataclasses import dataclass

from mindspeed_rl.config_cls.fields import opt


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmupConfig:
    """A random-init model never earns reward; a short supervised stage makes RL start from a
    policy that sometimes succeeds (what a pretrained model gives for free)."""

    enabled: bool = opt(False, "Run the SFT warm-up before GRPO.")
    steps: int = opt(200, "Optimizer steps.")
    lr: float = opt(1e-3, "Learning rate.")
    batch_size: int = opt(32, "Examples per step.")
    num_examples: int = opt(2000, "Generated reference examples to draw from.")
    seed: int = opt(0, "Seed of example generation and order.")
