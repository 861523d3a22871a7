"""Format verifiers for R1-style responses: reasoning in ``<think>...</think>``, then the answer.

- ``format``: one reasoning block (the response may start with it or with the text the template
  primed), closed exactly once, followed by a non-empty answer segment.
- ``strict_format``: the response is exactly ``<think>\\n…\\n</think>\\n`` then an answer that
  holds exactly one complete ``\\boxed{}`` and no further think tags.
"""

from __future__ import annotations

import re

from mindspeed_rl.models.rewards.answer_extraction import THINK_CLOSE, THINK_OPEN, boxed_contents

_STRICT_RE = re.compile(r"<think>\n(?P<reasoning>.*?)\n</think>\n(?P<answer>.*)", re.DOTALL)


def format_reward(response: str, label: str) -> float:
    del label  # the format check does not depend on the reference answer
    if response.count(THINK_CLOSE) != 1 or response.count(THINK_OPEN) > 1:
        return 0.0
    before, _, answer = response.partition(THINK_CLOSE)
    if THINK_OPEN in before and not before.lstrip().startswith(THINK_OPEN):
        return 0.0
    reasoning = before.replace(THINK_OPEN, "", 1)
    return 1.0 if reasoning.strip() and answer.strip() else 0.0


def strict_format_reward(response: str, label: str) -> float:
    del label
    if response.count(THINK_OPEN) != 1 or response.count(THINK_CLOSE) != 1:
        return 0.0
    match = _STRICT_RE.fullmatch(response)
    if match is None or not match.group("reasoning").strip():
        return 0.0
    return 1.0 if len(boxed_contents(match.group("answer"))) == 1 else 0.0
