"""Math answer verifiers built on the ``math-verify`` library.

What each registered name checks here (upstream uses the same names; the semantics are ours):

- ``acc``: R1-style. The answer is the last ``\\boxed{}`` after ``</think>`` (the whole response
  when there is no reasoning block). No box -> 0.
- ``math_17k_acc``: as ``acc``, but the label may be a full LaTeX solution (MATH-style datasets
  store worked solutions): the gold answer is the label's last ``\\boxed{}``, else the whole label.
- ``base_acc``: for base models that do not follow the think/answer template: the last
  ``\\boxed{}`` anywhere in the response; without one, math-verify's own extraction of the last
  LaTeX or plain expression in the response.
- ``math_verify_reward``: math-verify's extraction over the final segment (boxed answers first,
  then ``$...$`` and plain expressions such as "the answer is 1/2").

All return 1.0 for a match and 0.0 otherwise.

Timeouts: math-verify guards sympy with ``signal.alarm``, which raises outside the main thread
(Ray actors may run methods in a thread pool). In the main thread we keep its signal timeout; in
any other thread we pass ``None`` and instead bound the work by refusing answers longer than
``MAX_ANSWER_CHARS`` (they score 0) — long inputs are what make sympy slow.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from mindspeed_rl.models.rewards.answer_extraction import final_segment, last_boxed

MAX_ANSWER_CHARS = 1000
MAIN_THREAD_TIMEOUT_S = 5


def _timeout_for_this_thread() -> int | None:
    return MAIN_THREAD_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse(text: str, *, boxed_only: bool) -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    configs: list[Any] = [LatexExtractionConfig(boxed_match_priority=0)]
    if not boxed_only:
        configs.append(ExprExtractionConfig())
    return list(parse(text, extraction_config=configs, parsing_timeout=_timeout_for_this_thread()))


@functools.lru_cache(maxsize=4096)
def _parse_gold(label: str) -> tuple[Any, ...]:
    # Labels repeat n_samples_per_prompt times in a batch, so parsing once per label pays off.
    # A bare answer such as ``1/2`` or ``\frac{1}{2}`` is wrapped in $...$ so the LaTeX extractor
    # sees it as math.
    stripped = label.strip()
    text = stripped if ("\\boxed" in stripped or "$" in stripped) else f"${stripped}$"
    return tuple(_parse(text, boxed_only=False))


def _matches(gold_label: str, answer_text: str, *, boxed_only: bool) -> float:
    from math_verify import verify

    if not answer_text.strip() or len(answer_text) > MAX_ANSWER_CHARS or not gold_label.strip():
        return 0.0
    gold = list(_parse_gold(gold_label))
    pred = _parse(answer_text, boxed_only=boxed_only)
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=_timeout_for_this_thread()) else 0.0


def _boxed_answer_check(gold_label: str, text: str) -> float:
    boxed = last_boxed(text)
    if boxed is None:
        return 0.0
    return _matches(gold_label, f"\\boxed{{{boxed}}}", boxed_only=True)


def warm_up() -> None:
    """Import math-verify and build its parsers (~0.9 s the first time in a process) on a trivial
    input, so processes forked afterwards (the verifier pool) start warm."""
    _boxed_answer_check("1", "\\boxed{1}")


def acc(response: str, label: str) -> float:
    return _boxed_answer_check(label, final_segment(response))


def math_17k_acc(response: str, label: str) -> float:
    gold = last_boxed(label)
    return _boxed_answer_check(label if gold is None else gold, final_segment(response))


def base_acc(response: str, label: str) -> float:
    if last_boxed(response) is not None:
        return _boxed_answer_check(label, response)
    # Only the tail can hold a final answer; parsing a whole long response would also cost sympy time.
    return _matches(label, response[-MAX_ANSWER_CHARS:], boxed_only=False)


def math_verify_reward(response: str, label: str) -> float:
    segment = final_segment(response)
    return _matches(label, segment[-MAX_ANSWER_CHARS:], boxed_only=False)
