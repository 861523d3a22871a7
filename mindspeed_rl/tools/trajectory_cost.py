"""What a multi-turn trajectory costs a generation actor, in token-equivalents, for ASP.

ASP balances minibatches and batch groups by predicted response length, because a single-turn
response's decode time grows with its tokens. A trajectory also waits on its tools: while its code
runs it holds its place in the minibatch (the minibatch ends when its slowest trajectory does)
without decoding. Its cost is therefore

    response tokens (model turns + tool responses, all in the context) + tool seconds x r

where ``r`` is the per-sequence decode rate (tokens per second one trajectory advances while
decoding): tool seconds become the tokens the trajectory could have decoded meanwhile, and the
length predictor learns that one number per prompt.

``r`` is measured, not configured (``DecodeRate``): a minibatch lasts at least as long as each of
its trajectories needs, ``T >= model_tokens_i / r + tool_seconds_i``, so every trajectory gives a
lower bound ``r >= model_tokens_i / (T - tool_seconds_i)``; the largest bound of a minibatch is
its estimate (the trajectory that ended it), smoothed across minibatches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Smoothing of the per-minibatch estimates: a few minibatches settle it, one outlier does not.
_EWMA = 0.3
# A minibatch whose slowest trajectory spent nearly all of it in tools says little about decoding.
_MIN_DECODE_SECONDS = 1e-3


@dataclass(frozen=True, slots=True, kw_only=True)
class TrajectoryWork:
    """One finished trajectory as the cost model reads it."""

    response_tokens: int
    """All response tokens: the model's turns and the tool responses appended between them."""
    model_tokens: int
    """The tokens the policy decoded (loss mask 1)."""
    tool_seconds: float
    """Wall-clock seconds of its tool calls, summed over calls."""


def trajectory_cost(work: TrajectoryWork, tokens_per_s: float | None) -> float:
    """Token-equivalents of one trajectory; ``tokens_per_s`` None (not measured yet) = tokens only."""
    if work.tool_seconds < 0 or work.response_tokens < 0:
        raise ValueError(f"trajectory work must be non-negative; got {work}")
    if tokens_per_s is None:
        return float(work.response_tokens)
    return work.response_tokens + work.tool_seconds * tokens_per_s


class DecodeRate:
    """The measured per-sequence decode rate (tokens/s), from finished minibatches."""

    def __init__(self) -> None:
        self.tokens_per_s: float | None = None

    def observe(self, works: Sequence[TrajectoryWork], generation_seconds: float) -> float | None:
        """Update from a minibatch of ``works`` that took ``generation_seconds``; the new rate."""
        bounds = [
            w.model_tokens / (generation_seconds - w.tool_seconds)
            for w in works
            if w.model_tokens > 0 and generation_seconds - w.tool_seconds > _MIN_DECODE_SECONDS
        ]
        if not bounds:
            return self.tokens_per_s
        estimate = max(bounds)
        self.tokens_per_s = (
            estimate if self.tokens_per_s is None else (1 - _EWMA) * self.tokens_per_s + _EWMA * estimate
        )
        return self.tokens_per_s
