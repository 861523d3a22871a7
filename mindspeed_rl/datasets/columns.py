"""Upstream's ``map_keys``: which input column becomes the prompt, the label, and so on.

Keys (upstream meaning): ``prompt`` — the question column; ``query`` — optional extra input
appended to the prompt on a new line; ``response`` — the reference answer, our reward label;
``system`` — optional per-row system prompt; ``id`` (ours) — a column holding stable prompt ids.
An empty value (upstream writes ``query: ""``) means the key is not used.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass

from mindspeed_rl.datasets.sources import RawRow

ID_COLUMN_GUESSES = ("id", "prompt_id")
DEFAULT_MAP_KEYS: Mapping[str, str] = {"prompt": "prompt", "response": "answer"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ColumnMap:
    prompt: str
    response: str = ""
    query: str = ""
    system: str = ""
    id: str = ""

    @classmethod
    def from_map_keys(cls, map_keys: Mapping[str, str | None] | None) -> ColumnMap:
        given = dict(DEFAULT_MAP_KEYS if map_keys is None else map_keys)
        valid = ("prompt", "response", "query", "system", "id")
        for key in given:
            if key not in valid:
                nearest = difflib.get_close_matches(key, valid, n=1, cutoff=0.0)
                raise ValueError(
                    f"unknown map_keys key {key!r}; did you mean {nearest[0]!r}? Valid keys: {valid}"
                )
        cleaned = {key: (value or "") for key, value in given.items()}
        if not cleaned.get("prompt"):
            raise ValueError("map_keys.prompt is empty; name the input column that holds the question")
        return cls(**cleaned)


def _text(row: RawRow, column: str, key: str) -> str | None:
    if column not in row.values:
        raise ValueError(
            f"{row.location}: column {column!r} (map_keys.{key}) not found; available columns: "
            f"{sorted(row.values)}. Set map_keys.{key} to the right column"
        )
    value = row.values[column]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(
            f"{row.location}: column {column!r} (map_keys.{key}) holds a {type(value).__name__}, "
            "expected text or a number; point map_keys at a text column"
        )
    return str(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class MappedRow:
    prompt_id: str
    prompt: str | None  # None: the row has a null prompt (dropped and counted by the loader)
    label: str | None
    system: str


def map_row(row: RawRow, columns: ColumnMap) -> MappedRow:
    """Pick the mapped columns out of one row; missing columns raise, null values stay None."""
    prompt = _text(row, columns.prompt, "prompt")
    if columns.query and prompt is not None:
        query = _text(row, columns.query, "query")
        prompt = f"{prompt}\n{query}" if query else prompt
    label = _text(row, columns.response, "response") if columns.response else ""
    system = (_text(row, columns.system, "system") or "") if columns.system else ""
    return MappedRow(prompt_id=_prompt_id(row, columns), prompt=prompt, label=label, system=system)


def _prompt_id(row: RawRow, columns: ColumnMap) -> str:
    if columns.id:
        value = _text(row, columns.id, "id")
        if value is None:
            raise ValueError(f"{row.location}: id column {columns.id!r} is null; every row needs an id")
        return value
    for guess in ID_COLUMN_GUESSES:
        value = row.values.get(guess)
        if isinstance(value, str | int) and not isinstance(value, bool):
            return str(value)
    return row.default_id
