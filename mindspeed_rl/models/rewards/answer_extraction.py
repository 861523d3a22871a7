"""Locating the final answer inside a model response.

Shared by the math and format verifiers: both need the text after the reasoning block and the
content of the last ``\\boxed{...}`` with balanced braces (regexes cannot balance nested braces,
and answers such as ``\\frac{1}{2}`` always nest).
"""

from __future__ import annotations

import re

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def final_segment(response: str) -> str:
    """Text after the last ``</think>``; the whole response when there is no reasoning block."""
    # rpartition puts the whole string in the last slot when the separator is absent.
    return response.rpartition(THINK_CLOSE)[2]


def boxed_contents(text: str) -> list[str]:
    """Contents of every complete ``\\boxed{...}`` / ``\\fbox{...}`` in order of appearance.

    An unclosed box (a response truncated at ``max_tokens``) is not an answer, so it is skipped.
    """
    found: list[str] = []
    for match in _BOXED_RE.finditer(text):
        content = _balanced_from(text, match.end())
        if content is not None:
            found.append(content)
    return found


def last_boxed(text: str) -> str | None:
    """Content of the last complete box, or None when the text holds no box."""
    found = boxed_contents(text)
    return found[-1] if found else None


def _balanced_from(text: str, start: int) -> str | None:
    """Content up to the brace matching the one just before ``start``; None when never closed."""
    depth = 1
    for pos in range(start, len(text)):
        char = text[pos]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start:pos]
    return None
