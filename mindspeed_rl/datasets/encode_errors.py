"""Tokenizer trouble as one readable line: which row, which character, and what to do.

A tokenizer's own exception (``WordLevel error: Missing [UNK] token from the vocabulary``) names
neither the file, the line nor the character; ``encode_failure`` finds the first character the
tokenizer cannot encode on its own and says where it is. ``unknown_characters`` is the quiet
variant for tokenizers that do encode everything: which characters became the unknown token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from mindspeed_rl.datasets.records import PromptRecord


def encode_failure(tokenizer: Any, text: str, location: str, err: BaseException) -> ValueError:
    """The error to raise when ``tokenizer`` failed on ``text`` from ``location`` (file and line)."""
    cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    for index, char in enumerate(text):
        if _encodes(tokenizer, char):
            continue
        line = text.count("\n", 0, index) + 1
        column = index - (text.rfind("\n", 0, index) + 1) + 1
        where = f"column {column}" if "\n" not in text else f"text line {line}, column {column}"
        return ValueError(
            f"{location}: the tokenizer cannot encode character {char!r} (U+{ord(char):04X}) at "
            f"{where} of the templated prompt ({cause}). {_fix(tokenizer)}"
        )
    return ValueError(f"{location}: the tokenizer failed on this prompt ({cause}). {_fix(tokenizer)}")


def unknown_characters(tokenizer: Any, records: Iterable[PromptRecord]) -> tuple[int, Counter[str]]:
    """(prompts holding the unknown token, count of each character that became it).

    (0, empty) for a tokenizer without an unknown token, or when no prompt holds it."""
    unk_id = getattr(tokenizer, "unk_token_id", None)
    if unk_id is None:
        return 0, Counter()
    prompts, chars = 0, Counter[str]()
    verdict: dict[str, bool] = {}
    for record in records:
        if unk_id not in record.token_ids:
            continue
        prompts += 1
        for char in record.text:
            if char not in verdict:
                verdict[char] = unk_id in tokenizer.encode(char, add_special_tokens=False)
            if verdict[char]:
                chars[char] += 1
    return prompts, chars


def describe_characters(chars: Counter[str], limit: int = 6) -> str:
    """``'é' (U+00E9) x12, '∑' (U+2211) x3, ...``"""
    shown = ", ".join(f"{c!r} (U+{ord(c):04X}) x{n}" for c, n in chars.most_common(limit))
    more = len(chars) - limit
    return shown + (f" and {more} more" if more > 0 else "")


def _encodes(tokenizer: Any, char: str) -> bool:
    try:
        tokenizer.encode(char, add_special_tokens=False)
    except Exception:
        return False
    return True


def _fix(tokenizer: Any) -> str:
    if getattr(tokenizer, "unk_token", None) is None:
        return (
            "This tokenizer has no unknown token; if it is a tiny model folder built by an older "
            "version (runs/models/...), delete the folder so it is rebuilt with one, or pass a "
            "tokenizer that covers the character, or remove it from the data"
        )
    return "Pass a tokenizer that covers the character, or remove it from the data"
