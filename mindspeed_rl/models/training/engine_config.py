"""Settings of the torch training engine, in upstream MindSpeed-RL's names and batch-size units.

Torch-free: the config mapper (``trainer.run_plan``) builds and validates it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mindspeed_rl.models.loss.config import GRPOLossConfig
from mindspeed_rl.models.training.lr_schedule import LRSchedule


@dataclass(slots=True, frozen=True, kw_only=True)
class TorchEngineConfig:
    """One engine's optimisation settings (``actor_config`` + ``rl_config`` keys)."""

    lr: float = 1e-6
    """Peak AdamW learning rate (the schedule's ``lr``)."""
    lr_schedule: LRSchedule | None = None
    """Per-optimizer-step schedule; None = constant ``lr``."""
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    """Max global grad-norm; 0 disables clipping (the norm is still reported)."""
    micro_batch_size: int = 1
    """Samples per forward/backward in ``update`` (gradient accumulation unit)."""
    forward_micro_batch_size: int = 8
    """Samples per forward in ``compute_log_probs`` (upstream ``actor_forward_micro_batch_size``)."""
    mini_batch_size: int = 1
    """PROMPTS per optimizer step; the engine multiplies by ``n_samples_per_prompt``."""
    n_samples_per_prompt: int = 8
    epochs: int = 1
    shuffle_mini_batch: bool = False
    loss: GRPOLossConfig = field(default_factory=GRPOLossConfig)
    seed: int = 1
    device: str = "cpu"
    param_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype. The torch engine on CPU trains in float32 only: its log-probs must agree
    with the fp32 rollout engine to ~1e-6 (bf16 is for accelerator backends)."""
    pad_token_id: int = 0
    """Filler id for right padding; any valid id works since padded positions are masked."""

    def __post_init__(self) -> None:
        positive = {
            "micro_batch_size": self.micro_batch_size,
            "forward_micro_batch_size": self.forward_micro_batch_size,
            "mini_batch_size": self.mini_batch_size,
            "n_samples_per_prompt": self.n_samples_per_prompt,
            "epochs": self.epochs,
        }
        bad = {k: v for k, v in positive.items() if v < 1}
        if bad:
            raise ValueError(
                f"these batch settings must be >= 1: {bad}; fix them in actor_config / rl_config"
            )
        if self.lr <= 0 or self.clip_grad < 0 or self.weight_decay < 0:
            raise ValueError(
                f"need lr > 0, clip_grad >= 0, weight_decay >= 0; got lr={self.lr}, clip_grad={self.clip_grad}, "
                f"weight_decay={self.weight_decay}"
            )
        if self.lr_schedule is not None and self.lr_schedule.lr != self.lr:
            raise ValueError(
                f"lr_schedule.lr={self.lr_schedule.lr} differs from lr={self.lr}; build both from actor_config.lr"
            )
        if self.device == "cpu" and self.param_dtype != "float32":
            raise ValueError(
                f"param_dtype={self.param_dtype} on the CPU torch engine: it trains in float32 so its "
                "log-probs match the fp32 rollout; use float32 (bf16 needs an accelerator backend)"
            )

    @property
    def samples_per_mini_batch(self) -> int:
        return self.mini_batch_size * self.n_samples_per_prompt

    @property
    def schedule(self) -> LRSchedule:
        return self.lr_schedule if self.lr_schedule is not None else LRSchedule(lr=self.lr)
