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
