"""DAPO's soft overlong penalty: responses that run into the last ``buffer`` tokens before
``max_tokens`` lose reward linearly, up to ``factor`` at ``max_tokens``.

    exceed  = min(L - (max_tokens - buffer), buffer)
    penalty = min(-exceed / buffer * factor, 0)

A response shorter than ``max_tokens - buffer`` is untouched. Truncation alone would give a cut-off
answer the same reward as any other wrong one; the ramp tells the policy *how* long is too long
before it reaches the hard cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, kw_only=True)
class OverlongPenalty:
    """``rl_config``'s ``rollout_max_tokens``, ``overlong_buffer``, ``overlong_buffer_penalty_factor``."""

    max_tokens: int
    buffer: int
    factor: float

    def __post_init__(self) -> None:
        if not 0 < self.buffer <= self.max_tokens:
            raise ValueError(
                f"rl_config.overlong_buffer={self.buffer} must be in 1..rollout_max_tokens "
                f"({self.max_tokens}) when overlong_buffer_enable is true"
            )
        if not self.factor >= 0:
            raise ValueError(f"rl_config.overlong_buffer_penalty_factor={self.factor}; use a number >= 0")

    def __call__(self, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
        """The (non-positive) reward added to each response of ``lengths`` tokens."""
        length = np.asarray(lengths, dtype=np.float64)
        exceed = np.minimum(length - (self.max_tokens - self.buffer), self.buffer)
        return np.minimum(-exceed / self.buffer * self.factor, 0.0)
