"""Length predictions read from a file (JSONL or CSV), e.g. produced by an external model.

The file maps a prompt id to a predicted output length; ``FilePredictor`` only looks the ids up.
Everything a user can get wrong in such a file (missing ids, conflicting duplicates, non-numeric,
non-positive or non-finite lengths, empty files) is reported with the file, the line and a fix,
because a silently wrong prediction only shows up much later as a poor schedule.
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

import numpy as np

from asp_scheduler.jsonl import iter_json_objects
from asp_scheduler.predictors.base import PromptItem

_SUFFIXES = (".jsonl", ".csv")
_MAX_LISTED_IDS = 5


def _check_suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in _SUFFIXES:
        raise ValueError(
            f"{path}: unsupported prediction file type {suffix or '(none)'!r}; "
            f"use a file ending in one of {', '.join(_SUFFIXES)}"
        )
    return suffix


def _parse_length(raw: object, where: str, length_field: str) -> float:
    """Turn one raw cell into a positive finite float, or explain what is wrong with it."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError(
            f"{where}: {length_field!r} is {raw!r}, not a number; write the predicted token count as a number"
        )
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"{where}: {length_field!r} is {raw!r}, not a number; write the predicted token count as a number"
        ) from None
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(
            f"{where}: {length_field!r} is {value!r}; predicted lengths must be finite and > 0 "
            "(clip predictions to at least 1 token before writing them)"
        )
    return value


def _jsonl_rows(path: Path, id_field: str, length_field: str) -> Iterator[tuple[int, object, object]]:
    for line_no, record in iter_json_objects(path):
        for field in (id_field, length_field):
            if field not in record:
                raise ValueError(
                    f"{path}:{line_no}: field {field!r} is missing (fields present: {sorted(record)}); "
                    "add it or pass id_field=/length_field= naming the fields your file uses"
                )
        yield line_no, record[id_field], record[length_field]


def _csv_rows(path: Path, id_field: str, length_field: str) -> Iterator[tuple[int, object, object]]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        for field in (id_field, length_field):
            if field not in header:
                raise ValueError(
                    f"{path}:1: column {field!r} is missing from the header {header}; "
                    "add it or pass id_field=/length_field= naming the columns your file uses"
                )
        for record in reader:
            # reader.line_num is the physical line just read, which is what an editor shows.
            yield reader.line_num, record[id_field], record[length_field]


def load_predictions(
    path: str | os.PathLike[str], *, id_field: str = "prompt_id", length_field: str = "predicted_length"
) -> dict[str, float]:
    """Read ``prompt id -> predicted length`` from a JSONL or CSV file, validating every row."""
    file = Path(path)
    suffix = _check_suffix(file)
    if not file.is_file():
        raise ValueError(
            f"{file}: prediction file not found; check the path or write it with save_predictions()"
        )
    rows = _jsonl_rows if suffix == ".jsonl" else _csv_rows
    table: dict[str, float] = {}
    first_line: dict[str, int] = {}
    for line_no, raw_id, raw_length in rows(file, id_field, length_field):
        where = f"{file}:{line_no}"
        if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool) or raw_id == "":
            raise ValueError(f"{where}: {id_field!r} is {raw_id!r}; prompt ids must be non-empty strings")
        prompt_id = str(raw_id)
        value = _parse_length(raw_length, where, length_field)
        if prompt_id in table and table[prompt_id] != value:
            raise ValueError(
                f"{where}: prompt id {prompt_id!r} has length {value!r} here but {table[prompt_id]!r} on line "
                f"{first_line[prompt_id]}; keep one prediction per prompt (e.g. average the samples)"
            )
        table[prompt_id] = value
        first_line.setdefault(prompt_id, line_no)
    if not table:
        raise ValueError(f"{file}: no predictions found (file is empty); write one row per prompt id")
    return table


def save_predictions(
    path: str | os.PathLike[str],
    prompt_ids: Sequence[str],
    lengths: np.ndarray | Sequence[float],
    *,
    id_field: str = "prompt_id",
    length_field: str = "predicted_length",
) -> Path:
    """Write predictions as JSONL or CSV (by suffix) so that ``load_predictions`` returns them exactly.

    The file is written to a temporary name and renamed, so a crash never leaves half a file that a
    later run would read as a short (and then "missing ids") prediction table.
    """
    file = Path(path)
    suffix = _check_suffix(file)
    values = np.asarray(lengths, dtype=np.float64)
    if values.ndim != 1 or values.shape[0] != len(prompt_ids):
        raise ValueError(
            f"save_predictions: got {len(prompt_ids)} prompt ids but lengths of shape {values.shape}; "
            "pass one length per prompt id"
        )
    if len(prompt_ids) == 0:
        raise ValueError("save_predictions: no predictions to write; pass at least one prompt id")
    if len(set(prompt_ids)) != len(prompt_ids):
        raise ValueError("save_predictions: prompt ids are not unique; write one prediction per prompt")
    for prompt_id, value in zip(prompt_ids, values):
        _parse_length(float(value), f"save_predictions (prompt {prompt_id!r})", length_field)
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=file.name, suffix=".tmp", dir=file.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            _write_rows(handle, suffix, prompt_ids, values, id_field, length_field)
        os.replace(tmp_name, file)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return file


def _write_rows(
    handle: TextIO,
    suffix: str,
    prompt_ids: Sequence[str],
    values: np.ndarray,
    id_field: str,
    length_field: str,
) -> None:
    if suffix == ".jsonl":
        for prompt_id, value in zip(prompt_ids, values):
            handle.write(json.dumps({id_field: str(prompt_id), length_field: float(value)}) + "\n")
        return
    writer = csv.writer(handle)
    writer.writerow([id_field, length_field])
    # repr() of a Python float round-trips exactly.
    writer.writerows([str(pid), repr(float(value))] for pid, value in zip(prompt_ids, values))


class FilePredictor:
    """``LengthPredictor`` backed by a prediction file; ``fit`` is a no-op (the file is the model)."""

    __slots__ = ("_table", "name", "path")

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        id_field: str = "prompt_id",
        length_field: str = "predicted_length",
    ) -> None:
        self.name = "from_file"
        self.path = Path(path)
        # Loaded eagerly so a bad file fails when the config is built, not halfway through a schedule.
        self._table = load_predictions(self.path, id_field=id_field, length_field=length_field)

    def __len__(self) -> int:
        return len(self._table)

    def fit(self, prompts: Sequence[PromptItem], lengths: np.ndarray) -> FilePredictor:
        del prompts, lengths  # the predictions are fixed by the file
        return self

    def predict(self, prompts: Sequence[PromptItem]) -> np.ndarray:
        missing = [p.prompt_id for p in prompts if p.prompt_id not in self._table]
        if missing:
            shown = ", ".join(repr(m) for m in missing[:_MAX_LISTED_IDS])
            more = f" and {len(missing) - _MAX_LISTED_IDS} more" if len(missing) > _MAX_LISTED_IDS else ""
            raise ValueError(
                f"{self.path}: no prediction for {len(missing)} of {len(prompts)} prompts ({shown}{more}); "
                "regenerate the file for this prompt set or check that the ids match the dataset's prompt ids"
            )
        return np.fromiter((self._table[p.prompt_id] for p in prompts), dtype=np.float64, count=len(prompts))
