"""Periodic evaluation settings (torch-free; built by the config mapper)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalConfig:
    interval: int | None = None
    """``megatron_training.eval_interval``: iterations between evaluations; None = no evaluation."""
    num_samples_per_prompt: int = 1
    """Samples per held-out prompt; accuracy is pass@1 averaged over them."""
    max_prompts: int | None = None
    """Held-out prompts per evaluation (``eval_iters`` x global batch); None = all of them."""

    def __post_init__(self) -> None:
        if self.interval is not None and self.interval < 1:
            raise ValueError(
                f"megatron_training.eval_interval={self.interval}; use a positive number of "
                "iterations, or null for no evaluation"
            )
        if self.num_samples_per_prompt < 1:
            raise ValueError(
                f"evaluation num_samples_per_prompt={self.num_samples_per_prompt}; use 1 or more"
            )
        if self.max_prompts is not None and self.max_prompts < 1:
            raise ValueError(
                f"evaluation max_prompts={self.max_prompts} (eval_iters x global batch); use 1 or more, "
                "or eval_iters: 0 for every held-out prompt"
            )

    def due(self, iteration: int) -> bool:
        """Evaluate after 0-based iteration ``iteration``? Every ``interval``-th, counting from 1
        as Megatron does (interval 5 -> after iterations 4, 9, ...), never before training."""
        return self.interval is not None and (iteration + 1) % self.interval == 0
