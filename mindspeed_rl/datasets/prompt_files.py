"""The preprocessed prompt file: what ``cli/preprocess_data.py`` writes and ``load_prompts`` reads.

One row per kept prompt with columns ``prompt_id``, ``text`` (templated), ``token_ids``,
``label`` and ``prompt_type``. Storing the template name lets the loader refuse a file made
with another template instead of silently mixing formats.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from mindspeed_rl.datasets.records import PromptRecord, Tokenizer
from mindspeed_rl.datasets.sources import RawRow

PREPROCESSED_COLUMNS = ("prompt_id", "text", "token_ids", "label", "prompt_type")
OUTPUT_FORMATS = ("jsonl", "parquet")


def is_preprocessed(row: RawRow) -> bool:
    return "token_ids" in row.values and "text" in row.values


def record_from_preprocessed(row: RawRow, *, prompt_type: str) -> PromptRecord:
    missing = [c for c in PREPROCESSED_COLUMNS if c not in row.values]
    if missing:
        raise ValueError(f"{row.location}: preprocessed row lacks {missing}; re-run cli/preprocess_data.py")
    if row.values["prompt_type"] != prompt_type:
        raise ValueError(
            f"{row.location}: file was preprocessed with prompt_type {row.values['prompt_type']!r} but "
            f"{prompt_type!r} was requested; pass prompt_type={row.values['prompt_type']!r} or re-run preprocessing"
        )
    token_ids = row.values["token_ids"]
    if not isinstance(token_ids, list) or not all(isinstance(t, int) for t in token_ids):
        raise ValueError(f"{row.location}: token_ids must be a list of integers; re-run preprocessing")
    return PromptRecord(
        prompt_id=str(row.values["prompt_id"]),
        text=str(row.values["text"]),
        token_ids=tuple(token_ids),
        label=str(row.values["label"]),
    )


def check_same_tokenizer(record: PromptRecord, tokenizer: Tokenizer, location: str) -> None:
    """Token ids of a preprocessed file are only valid for the tokenizer that made them."""
    if tuple(tokenizer.encode(record.text, add_special_tokens=False)) != record.token_ids:
        raise ValueError(
            f"{location}: stored token_ids differ from this tokenizer's encoding of the text; the file was "
            "preprocessed with another tokenizer. Pass that tokenizer or re-run cli/preprocess_data.py"
        )


def write_prompt_file(
    records: Sequence[PromptRecord], *, output_prefix: str, prompt_type: str, output_format: str
) -> Path:
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"unknown output format {output_format!r}; use one of {OUTPUT_FORMATS}")
    rows = [
        {
            "prompt_id": r.prompt_id,
            "text": r.text,
            "token_ids": list(r.token_ids),
            "label": r.label,
            "prompt_type": prompt_type,
        }
        for r in records
    ]
    path = Path(f"{output_prefix}.{output_format}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if output_format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        with path.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
