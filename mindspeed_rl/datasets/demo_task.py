"""The built-in CPU demo task: string transformations a tiny char-level model can learn.

A prompt names an operation and a lowercase input, ``"<op>:<input>="``; the response is the
transformed string followed by eos. Operations:

- ``cp``   copy:       ``cp:abc=``   -> ``abc``
- ``up``   uppercase:  ``up:abc=``   -> ``ABC``
- ``rev``  reverse:    ``rev:abc=``  -> ``cba``
- ``repK`` repeat K x: ``rep3:ab=``  -> ``ababab``

Why this shape: the response length is a deterministic function of the prompt (input length, times
K for ``rep``), and input lengths are drawn from a clipped lognormal, so response lengths are
heavy-tailed across prompts (a few chars up to ``MAX_RESPONSE_CHARS``): exactly the setting where a
length-aware scheduler pays off, and a length predictor can learn it from the prompt text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALPHABET = "abcdefghijklmnopqrstuvwxyz"
OPERATIONS = ("cp", "up", "rev", "rep")
MAX_RESPONSE_CHARS = 192
EOS_TEXT = "<|endoftext|>"
# Seed streams: RL prompts and SFT pairs never share draws for the same user seed.
_RL_STREAM, _SFT_STREAM = 0, 1


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoLengths:
    """Input-length distribution: ``round(exp(N(log(median), sigma)))`` clipped to [1, max]."""

    median_chars: float = 7.0
    sigma: float = 0.8
    max_repeat: int = 6
    """``rep`` uses K in [2, max_repeat]; its input is drawn with half the median."""


DEFAULT_LENGTHS = DemoLengths()


def apply_operation(op: str, text: str) -> str:
    """The target response for ``op`` (``cp``, ``up``, ``rev`` or ``rep<K>``) on ``text``."""
    if op == "cp":
        return text
    if op == "up":
        return text.upper()
    if op == "rev":
        return text[::-1]
    if op.startswith("rep") and op[3:].isdigit():
        return text * int(op[3:])
    raise ValueError(f"unknown demo operation {op!r}; use one of cp, up, rev, rep<K>")


def _draw_length(rng: np.random.Generator, median: float, sigma: float, cap: int) -> int:
    return int(min(cap, max(1, round(math.exp(rng.normal(math.log(median), sigma))))))


def _draw_example(rng: np.random.Generator, lengths: DemoLengths) -> tuple[str, str]:
    kind = OPERATIONS[int(rng.integers(len(OPERATIONS)))]
    if kind == "rep":
        k = int(rng.integers(2, lengths.max_repeat + 1))
        n = _draw_length(rng, lengths.median_chars / 2, lengths.sigma, MAX_RESPONSE_CHARS // k)
        op = f"rep{k}"
    else:
        n = _draw_length(rng, lengths.median_chars, lengths.sigma, MAX_RESPONSE_CHARS)
        op = kind
    text = "".join(ALPHABET[i] for i in rng.integers(len(ALPHABET), size=n))
    return f"{op}:{text}=", apply_operation(op, text)


def _examples(num: int, seed: int, stream: int, lengths: DemoLengths) -> list[tuple[str, str]]:
    if num < 0:
        raise ValueError(f"num must be >= 0; got {num}")
    rng = np.random.default_rng([seed, stream])
    return [_draw_example(rng, lengths) for _ in range(num)]


def generate_demo_prompts(num: int, seed: int) -> list[dict[str, str]]:
    """``num`` RL prompts as ``{"prompt": "rev:abc=", "answer": "cba"}``; deterministic in ``seed``."""
    return [{"prompt": p, "answer": a} for p, a in _examples(num, seed, _RL_STREAM, DEFAULT_LENGTHS)]


def demo_sft_pairs(num: int, seed: int) -> list[tuple[str, str]]:
    """``num`` (prompt, target) warm-up pairs from a seed stream disjoint from the RL prompts'."""
    return _examples(num, seed, _SFT_STREAM, DEFAULT_LENGTHS)


def clean_response(response: str) -> str:
    """Cut at the first eos text (when a decoder kept special tokens) and strip trailing whitespace."""
    return response.split(EOS_TEXT, 1)[0].rstrip()


def demo_reward(response: str, answer: str) -> float:
    """Partial credit in [0, 1]: position-wise matching characters / max(len(response), len(answer)).

    Exact answer -> 1. Every wrong, missing or extra character costs the same ``1 / max_len``, so
    stopping early, running on past the answer and wrong characters are all penalised and the
    reward is dense. Positions are compared one-to-one (no alignment), so an early dropped
    character shifts the rest and costs more: that keeps the verifier O(length).
    """
    got = clean_response(response)
    longest = max(len(got), len(answer))
    if longest == 0:
        return 1.0
    matches = sum(1 for a, b in zip(got, answer) if a == b)
    return matches / longest
