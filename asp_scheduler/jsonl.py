"""Reading the scheduler's JSONL inputs with errors that name the file, the line and the fix."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from asp_scheduler.predictors.base import PromptItem


def iter_json_objects(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of a JSONL file, with clear errors."""
    file = Path(path)
    with file.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{file}:{line_no}: invalid JSON ({err.msg}); write one JSON object per line"
                ) from None
            if not isinstance(record, dict):
                raise ValueError(f"{file}:{line_no}: expected a JSON object, got {type(record).__name__}")
            yield line_no, record


def _records(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{file}: file not found; check the path")
    out = list(iter_json_objects(file))
    if not out:
        raise ValueError(f"{file}: the file is empty; write one JSON object per item")
    return out


def read_lengths(path: str | Path, field: str) -> np.ndarray:
    """One measured length per row (file order), validated: numeric, finite, >= 0."""
    values = []
    for line_no, record in _records(path):
        if field not in record:
            raise ValueError(
                f"{path}:{line_no}: field {field!r} is missing (present: {sorted(record)}); "
                "pass --field naming the length field"
            )
        raw = record[field]
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise ValueError(
                f"{path}:{line_no}: {field!r} is {raw!r}, not a number; lengths are token counts"
            )
        if not math.isfinite(raw) or raw < 0:
            raise ValueError(f"{path}:{line_no}: {field!r} is {raw!r}; lengths must be finite and >= 0")
        values.append(float(raw))
    return np.asarray(values, dtype=np.float64)


def read_prompts(
    path: str | Path, id_field: str = "prompt_id", text_field: str = "prompt"
) -> list[PromptItem]:
    """Prompts in file order; ids must be unique (one schedulable item each)."""
    prompts = []
    seen: set[str] = set()
    for line_no, record in _records(path):
        if id_field not in record:
            raise ValueError(
                f"{path}:{line_no}: field {id_field!r} is missing; pass --id-field naming the id field"
            )
        pid = str(record[id_field])
        if pid in seen:
            raise ValueError(f"{path}:{line_no}: duplicate prompt id {pid!r}; every prompt needs a unique id")
        seen.add(pid)
        text = record.get(text_field)
        prompts.append(PromptItem(prompt_id=pid, text="" if text is None else str(text)))
    return prompts


def read_length_pairs(
    path: str | Path, *, id_field: str = "prompt_id", length_field: str = "length", text_field: str = "prompt"
) -> list[tuple[str, str | None, float]]:
    """Profiled ``(prompt id, prompt text or None, measured length)`` rows in file order.

    Repeated ids are kept (several sampled responses of one prompt); the text is optional so a
    file of ids and lengths can be joined with the prompt set that holds the texts.
    """
    rows: list[tuple[str, str | None, float]] = []
    for line_no, record in _records(path):
        for name in (id_field, length_field):
            if name not in record:
                raise ValueError(
                    f"{path}:{line_no}: field {name!r} is missing (present: {sorted(record)}); "
                    f"write rows like {{{id_field!r}: ..., {length_field!r}: ..., {text_field!r}: ...}}"
                )
        raw = record[length_field]
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw <= 0:
            raise ValueError(
                f"{path}:{line_no}: {length_field!r} is {raw!r}; measured lengths must be numbers > 0 (tokens)"
            )
        text = record.get(text_field)
        rows.append((str(record[id_field]), None if text is None else str(text), float(raw)))
    return rows
