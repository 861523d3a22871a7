"""The built-in CPU demo task: write a character N times.

A prompt names a lowercase character and a count, ``"<c>*<N>="``; the answer is ``c`` repeated
``N`` times, then eos. Example: ``"k*5="`` -> ``"kkkkk"``.

Why this task (measured on 2 CPU cores, see the issue note): a ~0.1 M-parameter model learns the
format and the character from a 150-step SFT warm-up in seconds, but its stopping point stays
imprecise (counting is the hard part), so sampled rewards start around 0.5 and GRPO has a
consistent, prompt-independent signal to climb ("stop at exactly N"). Earlier string-rewriting
variants (copy / reverse / repeat a random string) left the tiny model with errors that GRPO did not
fix within 30 iterations. N is drawn from a clipped lognormal, so response lengths depend on the
prompt and are heavy-tailed across prompts (median ~8, a tail up to ``MAX_RESPONSE_CHARS``): the
setting where a length-aware scheduler pays off, and the count is readable from the prompt text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

ALPHABET = "abcdefghijklmnopqrstuvwxyz"
MAX_RESPONSE_CHARS = 150
EOS_TEXT = "<|endoftext|>"
_PROMPT = re.compile(r"^([a-z])\*(\d+)=$")
# Seed streams: RL prompts and SFT pairs never share draws for the same user seed.
_RL_STREAM, _SFT_STREAM = 0, 1


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoLengths:
    """Count distribution: ``round(exp(N(log(median), sigma)))`` clipped to [1, max_count]."""

    median_count: float = 8.0
    sigma: float = 0.8
    max_count: int = MAX_RESPONSE_CHARS


DEFAULT_LENGTHS = DemoLengths()
# ``builtin:demo_short``, the `make demo` variant: counts 1-24 (median 5). The tiny model cannot
# count out DEFAULT_LENGTHS' 20-150 tail, which caps its reward near 0.8 and leaves a 30-iteration
# demo little visible room; the ASP benchmarks keep DEFAULT_LENGTHS (``builtin:demo``), whose long
# tail is what a length-aware schedule is measured on.
SHORT_LENGTHS = DemoLengths(median_count=5.0, sigma=0.6, max_count=24)


def answer_for(prompt: str) -> str:
    """The exact answer to a demo prompt ``"<c>*<N>="``."""
    match = _PROMPT.match(prompt)
    if match is None:
        raise ValueError(f"not a demo prompt: {prompt!r}; expected '<lowercase char>*<count>=' like 'k*5='")
    return match.group(1) * int(match.group(2))


def _draw_example(rng: np.random.Generator, lengths: DemoLengths) -> tuple[str, str]:
    char = ALPHABET[int(rng.integers(len(ALPHABET)))]
    count = int(
        min(
            lengths.max_count,
            max(1, round(math.exp(rng.normal(math.log(lengths.median_count), lengths.sigma)))),
        )
    )
    prompt = f"{char}*{count}="
    return prompt, answer_for(prompt)


def _examples(num: int, seed: int, stream: int, lengths: DemoLengths) -> list[tuple[str, str]]:
    if num < 0:
        raise ValueError(f"num must be >= 0; got {num}")
    rng = np.random.default_rng([seed, stream])
    return [_draw_example(rng, lengths) for _ in range(num)]


def generate_demo_prompts(num: int, seed: int) -> list[dict[str, str]]:
    """``num`` RL prompts as ``{"prompt": "k*5=", "answer": "kkkkk"}``; deterministic in ``seed``."""
    return [{"prompt": p, "answer": a} for p, a in _examples(num, seed, _RL_STREAM, DEFAULT_LENGTHS)]


def generate_demo_short_prompts(num: int, seed: int) -> list[dict[str, str]]:
    """As ``generate_demo_prompts`` with ``SHORT_LENGTHS`` counts (``builtin:demo_short``)."""
    return [{"prompt": p, "answer": a} for p, a in _examples(num, seed, _RL_STREAM, SHORT_LENGTHS)]


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
    reward is dense (for this task it is ``min(len)/max(len)`` when the character is right).
    """
    got = clean_response(response)
    longest = max(len(got), len(answer))
    if longest == 0:
        return 1.0
    matches = sum(1 for a, b in zip(got, answer) if a == b)
    return matches / longest
