"""Reading prompt rows from JSONL / JSON / Parquet files or a folder of them.

A row keeps where it came from (``location`` for error messages, ``default_id`` for prompts
without an id column) so every later error can name the file and line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ROW_SUFFIXES = (".jsonl", ".parquet")
FILE_SUFFIXES = (*ROW_SUFFIXES, ".json")


@dataclass(frozen=True, slots=True, kw_only=True)
class RawRow:
    """One input row before column mapping."""

    values: Mapping[str, Any]
    location: str  # "<file> line N" / "<file> row N"
    default_id: str  # "<file name>:<row index>", stable as long as the file is unchanged


def resolve_data_files(data_path: str) -> list[Path]:
    """The data files behind ``data_path``: a file, a folder, or an upstream-style prefix.

    Upstream passes ``data_path: ./dataset/x/data`` for the files ``data.*`` written by
    preprocessing, so a path that does not exist is retried with each supported suffix.
    """
    path = Path(data_path)
    if path.is_file():
        if path.suffix not in FILE_SUFFIXES:
            raise ValueError(
                f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(FILE_SUFFIXES)}"
            )
        return [path]
    if path.is_dir():
        return _files_in_folder(path)
    candidates = [Path(f"{data_path}{suffix}") for suffix in ROW_SUFFIXES]
    found = [c for c in candidates if c.is_file()]
    if len(found) == 1:
        return found
    if len(found) > 1:
        raise ValueError(
            f"data_path {data_path!r} matches {[str(f) for f in found]}; name one file explicitly"
        )
    raise ValueError(
        f"data_path {data_path!r} does not exist (also tried {', '.join(str(c) for c in candidates)}); "
        "point it at a .jsonl/.parquet file, a folder of them, or a preprocess output prefix"
    )


def _files_in_folder(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in ROW_SUFFIXES)
    ignored = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix not in ROW_SUFFIXES)
    if ignored:
        logger.info("data folder %s: ignoring non-data files %s", folder, ignored)
    if not files:
        raise ValueError(
            f"data folder {folder} holds no {' or '.join(ROW_SUFFIXES)} files; add data files or fix data_path"
        )
    return files


def read_rows(path: Path) -> Iterator[RawRow]:
    """Rows of one file, in file order; ValueError naming file and line for anything malformed."""
    if path.suffix == ".parquet":
        rows = _parquet_rows(path)
    elif path.suffix == ".json" and _starts_with(path, b"["):
        rows = _json_array_rows(path)
    else:
        rows = _jsonl_rows(path)
    num_rows = 0
    for row in rows:
        num_rows += 1
        yield row
    if num_rows == 0:
        raise ValueError(f"{path} holds no rows; remove the empty file or regenerate it")


def _starts_with(path: Path, prefix: bytes) -> bool:
    with path.open("rb") as handle:
        return handle.read(4096).lstrip().startswith(prefix)


def _jsonl_rows(path: Path) -> Iterator[RawRow]:
    index = 0
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            location = f"{path} line {line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{location} is not valid UTF-8 ({err.reason}); re-encode the file as UTF-8"
                ) from err
            if not line.strip():
                continue  # blank separator lines carry no prompt
            try:
                values = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{location} is not valid JSON ({err.msg}); write one JSON object per line"
                ) from err
            yield _as_row(values, location, f"{path.name}:{index}")
            index += 1


def _json_array_rows(path: Path) -> Iterator[RawRow]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(
            f"{path} is not a UTF-8 JSON array ({err}); fix the file or convert it to JSONL"
        ) from err
    if not isinstance(data, list):
        raise ValueError(f"{path} must hold a JSON array of objects; convert it to JSONL")
    for index, values in enumerate(data):
        yield _as_row(values, f"{path} item {index}", f"{path.name}:{index}")


def _parquet_rows(path: Path) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    for index, values in enumerate(table.to_pylist()):
        yield _as_row(values, f"{path} row {index}", f"{path.name}:{index}")


def _as_row(values: Any, location: str, default_id: str) -> RawRow:
    if not isinstance(values, dict):
        raise ValueError(
            f"{location} is a {type(values).__name__}, expected a JSON object with named columns"
        )
    return RawRow(values=values, location=location, default_id=default_id)
