"""DAPO's math scorer, under upstream's verifier name ``acc_for_dapo``: +1 for a correct final
answer, -1 otherwise (not 1 / 0: DAPO's recipes train on the signed score).

Two ways to find the answer, both reading only the end of the response (a long reasoning trace
may mention many candidate numbers; the answer is what the response ends on):

* default (``acc_for_dapo``): the text after the last ``Answer:`` among the last 300 characters,
  compared with the label after Minerva-style normalisation (units, ``\\text{}``, ``$``, spaces,
  ``\\boxed{}`` and shorthand ``\\frac12`` written out), so "Answer: $\\boxed{12}$ dollars" matches 12;
* strict box (``acc_for_dapo_strict_box``): the content of the last complete ``\\boxed{...}``
  among the last 100 characters, equal to the label character for character.

Pure string work, linear in the response: it runs in the calling process, no timeout needed.
"""

from __future__ import annotations

import re

from mindspeed_rl.models.rewards.answer_extraction import last_boxed

_ANSWER_TAIL = 300
_BOX_TAIL = 100
_ANSWER_LINE = re.compile(r"(?i)answer\s*:\s*([^\n]+)")

# Rewrites applied in order, then whole words / markup dropped: the Minerva recipe's choices
# (answers to competition problems carry units and LaTeX decoration the label does not).
_REWRITES: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_UNIT_WORDS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds",
    "meters", "meals", "edges", "students", "childrentickets", "multiples",
)  # fmt: skip
_MARKUP = (
    "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
    "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip
_UNWRAP = tuple(re.compile(rf"(\\{cmd}\{{)(.*?)(\}})") for cmd in ("text", "textbf", "overline"))
_BOXED_GREEDY = re.compile(r"(\\boxed\{)(.*)(\})")
_FIRST_MATH = re.compile(r"(.*?)(\$)(.*?)(\$)(.*)")
_SHORT_FRAC = re.compile(r"(frac)([^{])(.)")
_SHORT_SQRT = re.compile(r"(sqrt)([^{])")


def normalize_answer(text: str) -> str:
    """The comparable form of a final answer (Minerva's normalisation, see the module docstring)."""
    text = text.split("=")[-1]
    for old, new in _REWRITES:
        text = text.replace(old, new)
    for word in (*_UNIT_WORDS, *_MARKUP):
        text = text.replace(word, "")
    text = _FIRST_MATH.sub(r"$\3$", text)
    for pattern in _UNWRAP:
        text = pattern.sub(r"\2", text)
    text = _BOXED_GREEDY.sub(r"\2", text)
    text = _SHORT_FRAC.sub(r"frac{\2}{\3}", text)
    text = _SHORT_SQRT.sub(r"sqrt{\2}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def answer_after_marker(response: str) -> str | None:
    """The text after the last ``Answer:`` near the end of ``response``, or None."""
    found = _ANSWER_LINE.findall(response[-_ANSWER_TAIL:])
    return found[-1] if found else None


def acc_for_dapo(response: str, label: str) -> float:
    """+1 when the normalised answer after the last ``Answer:`` equals the normalised label, else -1."""
    answer = answer_after_marker(response)
    if answer is None:
        return -1.0
    return 1.0 if normalize_answer(answer) == normalize_answer(label) else -1.0


def acc_for_dapo_strict_box(response: str, label: str) -> float:
    """+1 when the last complete ``\\boxed{}`` near the end equals ``label`` exactly, else -1."""
    boxed = last_boxed(response[-_BOX_TAIL:])
    return 1.0 if boxed is not None and boxed == label else -1.0
