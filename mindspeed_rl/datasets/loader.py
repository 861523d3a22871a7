"""``load_prompts``: the one entry point from a data source to tokenized prompt records.

Flow: rows (files or a built-in generator) -> map_keys -> chat template -> tokenize ->
``max_prompt_length`` filter (dropped prompts counted by reason and logged) -> optional seeded
subset of ``num_samples``. Preprocessed files skip straight to the length filter.

``stream_prompts`` is the same flow, one pass over the files, read and tokenized only as the
caller draws: a streaming run (``asp_config.window``) never holds the dataset.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from mindspeed_rl.datasets import builtin, prompt_files, sources
from mindspeed_rl.datasets.columns import ColumnMap, map_row
from mindspeed_rl.datasets.encode_errors import encode_failure
from mindspeed_rl.datasets.records import DropCounter, PromptRecord, PromptSet, Tokenizer
from mindspeed_rl.datasets.templates import apply_template, check_prompt_type

logger = logging.getLogger(__name__)

DROP_TOO_LONG = "too_long"
DROP_EMPTY_PROMPT = "empty_prompt"
DROP_MISSING_LABEL = "missing_label"


def load_prompts(
    *,
    data_path: str,
    tokenizer: Tokenizer,
    prompt_type: str = "empty",
    map_keys: Mapping[str, str] | None = None,
    max_prompt_length: int,
    num_samples: int | None = None,
    seed: int = 0,
) -> PromptSet:
    """Load, template, tokenize and length-filter prompts.

    ``data_path``: a .jsonl/.json/.parquet file, a folder of .jsonl/.parquet files, an upstream
    output prefix (``<prefix>.jsonl``), or ``builtin:demo`` / ``builtin:demo_short`` / ``builtin:maze``. For files,
    ``num_samples`` draws a seeded subset (kept in source order) of the prompts that survive the
    filter; for built-ins it is the number generated (required) and ``seed`` seeds the generator.
    """
    check_prompt_type(prompt_type)
    if max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"num_samples must be >= 1 or None (all prompts), got {num_samples}")
    counter = DropCounter()
    if builtin.is_builtin(data_path):
        records = _load_builtin(
            data_path, tokenizer, prompt_type, map_keys, max_prompt_length, num_samples, seed, counter
        )
    else:
        columns = ColumnMap.from_map_keys(map_keys)
        records = []
        for path in sources.resolve_data_files(data_path):
            rows = sources.read_rows(path)
            records.extend(_records(rows, tokenizer, prompt_type, columns, max_prompt_length, counter))
        records = _subset(records, num_samples, seed, counter)
    _check_unique_ids(records)
    drops = counter.report()
    log = logger.warning if drops.num_dropped else logger.info
    log("prompts from %s: %s", data_path, drops.summary())
    return PromptSet(records=records, drops=drops)


def stream_prompts(
    *,
    data_path: str,
    tokenizer: Tokenizer,
    prompt_type: str = "empty",
    map_keys: Mapping[str, str] | None = None,
    max_prompt_length: int,
) -> Iterator[PromptRecord]:
    """``load_prompts``'s records of files, in source order, produced one at a time.

    The checks that need the whole dataset happen as the pass goes: a repeated id fails the draw
    that meets it (naming the id), and the drops are logged when the pass ends. Built-in tasks
    are generated whole; load them with ``load_prompts``."""
    check_prompt_type(prompt_type)
    if max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
    if builtin.is_builtin(data_path):
        raise ValueError(f"{data_path} is generated whole; load it with load_prompts, not a stream")
    files = sources.resolve_data_files(data_path)  # a missing path fails before the first draw
    return _stream(
        files, data_path, tokenizer, prompt_type, ColumnMap.from_map_keys(map_keys), max_prompt_length
    )


def _stream(
    files: list[Path],
    data_path: str,
    tokenizer: Tokenizer,
    prompt_type: str,
    columns: ColumnMap,
    max_prompt_length: int,
) -> Iterator[PromptRecord]:
    counter, seen = DropCounter(), set[str]()
    for path in files:
        for record in _records(
            sources.read_rows(path), tokenizer, prompt_type, columns, max_prompt_length, counter
        ):
            if record.prompt_id in seen:
                raise ValueError(
                    f"prompt id {record.prompt_id!r} appears twice in {data_path}; fix the id column "
                    "or set map_keys.id to a column with unique values"
                )
            seen.add(record.prompt_id)
            yield record
    drops = counter.report()
    (logger.warning if drops.num_dropped else logger.info)(
        "prompts streamed from %s: %s", data_path, drops.summary()
    )


def _load_builtin(
    data_path: str,
    tokenizer: Tokenizer,
    prompt_type: str,
    map_keys: Mapping[str, str] | None,
    max_prompt_length: int,
    num_samples: int | None,
    seed: int,
    counter: DropCounter,
) -> list[PromptRecord]:
    if num_samples is None:
        raise ValueError(f"{data_path} generates prompts: pass num_samples (how many to generate)")
    if map_keys is not None:
        raise ValueError(
            f"{data_path} has fixed columns (prompt, answer); remove map_keys for built-in sources"
        )
    rows = builtin.builtin_rows(data_path, num=num_samples, seed=seed)
    columns = ColumnMap.from_map_keys(None)
    return list(_records(iter(rows), tokenizer, prompt_type, columns, max_prompt_length, counter))


def _records(
    rows: Iterable[sources.RawRow],
    tokenizer: Tokenizer,
    prompt_type: str,
    columns: ColumnMap,
    max_prompt_length: int,
    counter: DropCounter,
) -> Iterable[PromptRecord]:
    first = True
    for row in rows:
        counter.num_total += 1
        if prompt_files.is_preprocessed(row):
            record = prompt_files.record_from_preprocessed(row, prompt_type=prompt_type)
            if first:
                prompt_files.check_same_tokenizer(record, tokenizer, row.location)
        else:
            mapped = map_row(row, columns)
            if mapped.prompt is None or not mapped.prompt.strip():
                counter.drop(DROP_EMPTY_PROMPT, mapped.prompt_id)
                continue
            if mapped.label is None:
                counter.drop(DROP_MISSING_LABEL, mapped.prompt_id)
                continue
            text = apply_template(prompt_type, mapped.prompt, system=mapped.system)
            try:
                token_ids = tuple(tokenizer.encode(text, add_special_tokens=False))
            except Exception as err:  # the tokenizer's own message names no file, line or character
                raise encode_failure(tokenizer, text, row.location, err) from err
            record = PromptRecord(
                prompt_id=mapped.prompt_id, text=text, token_ids=token_ids, label=mapped.label
            )
        first = False
        if len(record.token_ids) > max_prompt_length:
            counter.drop(DROP_TOO_LONG, record.prompt_id)
            continue
        yield record


def _subset(
    records: list[PromptRecord], num_samples: int | None, seed: int, counter: DropCounter
) -> list[PromptRecord]:
    if num_samples is None:
        return records
    if num_samples > len(records):
        raise ValueError(
            f"num_samples={num_samples} but only {len(records)} prompts remain "
            f"({counter.report().summary()}); lower num_samples or raise max_prompt_length"
        )
    # Prompts not drawn are a requested subset, not a loss: counted apart from the drop reasons.
    keep = sorted(random.Random(seed).sample(range(len(records)), num_samples))
    counter.num_unsampled = len(records) - num_samples
    return [records[i] for i in keep]


def _check_unique_ids(records: list[PromptRecord]) -> None:
    seen: dict[str, int] = {}
    for record in records:
        seen[record.prompt_id] = seen.get(record.prompt_id, 0) + 1
    duplicates = sorted(pid for pid, count in seen.items() if count > 1)
    if duplicates:
        raise ValueError(
            f"prompt ids are not unique: {duplicates[:5]} (and {max(0, len(duplicates) - 5)} more); "
            "fix the id column or set map_keys.id to a column with unique values"
        )
