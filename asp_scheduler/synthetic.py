"""Synthetic output lengths (the paper's Table 6 families) and a small bundled prompt set.

Parameters of the four families are not given in the paper; the ones below are ours (medians
of a few hundred to a few thousand tokens, like reasoning traces), always clipped at 8,192.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asp_scheduler.predictors.base import PromptItem

DISTRIBUTIONS = ("lognormal", "exponential", "pareto", "bimodal")
DEFAULT_CLIP = 8192


def draw_lengths(distribution: str, n: int, rng: np.random.Generator, clip: int = DEFAULT_CLIP) -> np.ndarray:
    """``n`` output lengths in tokens (float64, in ``[1, clip]``) from one named family."""
    if distribution == "lognormal":
        raw = rng.lognormal(mean=np.log(1000.0), sigma=1.0, size=n)
    elif distribution == "exponential":
        raw = rng.exponential(scale=1500.0, size=n)
    elif distribution == "pareto":
        raw = (rng.pareto(1.5, size=n) + 1.0) * 300.0
    elif distribution == "bimodal":
        short = rng.normal(800.0, 200.0, size=n)
        long = rng.normal(5000.0, 1200.0, size=n)
        raw = np.where(rng.random(n) < 0.6, short, long)
    else:
        raise ValueError(f"unknown length distribution {distribution!r}; choose one of {DISTRIBUTIONS}")
    return np.clip(np.round(raw), 1, clip)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticDataset:
    prompts: list[PromptItem]
    lengths: np.ndarray
    """Measured (here: generated) response length of each prompt, in tokens."""


_TOPICS = ("algebra", "geometry", "number theory", "combinatorics", "probability", "calculus")
_STEPS = ("simplify", "factor", "count the cases", "bound the sum", "prove the identity", "solve for x")


def synthetic_prompts(num_prompts: int = 4000, seed: int = 0, clip: int = DEFAULT_CLIP) -> SyntheticDataset:
    """Deterministic math-flavoured prompts whose heavy-tailed lengths grow with their difficulty.

    The text carries the difficulty (number of requested steps, topic), so learned predictors
    have signal to find, while per-prompt noise keeps the ranking imperfect.
    """
    if num_prompts <= 0:
        raise ValueError(f"num_prompts must be positive, got {num_prompts}")
    rng = np.random.default_rng(seed)
    difficulty = rng.integers(1, 11, size=num_prompts)
    topic = rng.integers(0, len(_TOPICS), size=num_prompts)
    log_len = np.log(400.0) + 0.2 * difficulty + 0.05 * topic + rng.normal(0.0, 0.35, size=num_prompts)
    lengths = np.clip(np.round(np.exp(log_len)), 1, clip)
    prompts = []
    for i in range(num_prompts):
        steps = ", then ".join(_STEPS[(i + s) % len(_STEPS)] for s in range(int(difficulty[i])))
        text = f"[{_TOPICS[topic[i]]}] Problem {i}: {steps}. Give the final answer in a box."
        prompts.append(PromptItem(prompt_id=f"synthetic-{i:05d}", text=text))
    return SyntheticDataset(prompts=prompts, lengths=lengths.astype(np.float64))
