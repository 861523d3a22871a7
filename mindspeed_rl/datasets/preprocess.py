"""Offline prompt preprocessing (upstream's ``preprocess_data.py`` analogue).

Reads ``input``, applies the ``prompt_type`` template, tokenizes, drops prompts longer than
``max_prompt_length`` (counted and reported) and writes ``<output_prefix>.jsonl`` (or
``.parquet``), which ``load_prompts(data_path=<output_prefix>)`` reads back directly.

Where we depart from upstream: the output is a JSONL/Parquet prompt file, not Megatron indexed
``.bin/.idx`` files (prompts are few and short; readable files are easier to check), and
``handler_name``, ``workers`` and ``log_interval`` are accepted for compatibility but inert: one
handler covers the alpaca- and R1-style inputs, and tokenizing prompts is not the bottleneck.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from mindspeed_rl.datasets.encode_errors import describe_characters, unknown_characters
from mindspeed_rl.datasets.loader import load_prompts
from mindspeed_rl.datasets.prompt_files import write_prompt_file
from mindspeed_rl.datasets.records import DropReport, PromptRecord

logger = logging.getLogger(__name__)

INERT_KEYS = ("handler_name", "workers", "log_interval")


@dataclass(frozen=True, slots=True, kw_only=True)
class PreprocessConfig:
    input: str
    """Source file, folder or ``builtin:<task>`` (see ``load_prompts``)."""
    tokenizer_name_or_path: str
    """Local HF tokenizer folder (or a name already in the local HF cache)."""
    output_prefix: str
    """Output path without suffix; the trainer's ``data_path`` takes the same value."""
    tokenizer_type: str = "PretrainedFromHF"
    prompt_type: str = "empty"
    map_keys: Mapping[str, str] | None = None
    dataset_additional_keys: tuple[str, ...] = ("labels",)
    """Upstream's extra columns; only ``labels`` (the reward label) is carried."""
    max_prompt_length: int = 2048
    output_format: str = "jsonl"
    num_samples: int | None = None
    """Required for ``builtin:`` inputs; for files, a seeded subset."""
    seed: int = 0
    handler_name: str = ""
    workers: int = 1
    log_interval: int = 1000

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> PreprocessConfig:
        valid = [f.name for f in fields(cls)]
        for key in raw:
            if key not in valid:
                nearest = difflib.get_close_matches(key, valid, n=1, cutoff=0.0)
                raise ValueError(f"unknown preprocess config key {key!r}; did you mean {nearest[0]!r}?")
        missing = [k for k in ("input", "tokenizer_name_or_path", "output_prefix") if not raw.get(k)]
        if missing:
            raise ValueError(
                f"preprocess config lacks {missing}; add them to the YAML or as key=value overrides"
            )
        values = dict(raw)
        values["dataset_additional_keys"] = tuple(values.get("dataset_additional_keys") or ())
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        if self.tokenizer_type != "PretrainedFromHF":
            raise ValueError(f"tokenizer_type {self.tokenizer_type!r} is not supported; use PretrainedFromHF")
        unknown = [k for k in self.dataset_additional_keys if k != "labels"]
        if unknown:
            raise ValueError(
                f"dataset_additional_keys {unknown} are not supported: the prompt record carries only the "
                "label (map_keys.response); use dataset_additional_keys: [labels]"
            )


def load_tokenizer(name_or_path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except OSError as err:  # transformers' own message is a paragraph about the hub
        raise ValueError(
            f"tokenizer_name_or_path={name_or_path!r} is not a tokenizer folder ({type(err).__name__}); "
            "point it at a local HF model folder, e.g. runs/models/tiny_qwen3 (make demo builds it)"
        ) from err


def run_preprocess(config: PreprocessConfig, tokenizer: Any | None = None) -> tuple[Path, DropReport]:
    """Write the prompt file; returns its path and the drop report."""
    for key in INERT_KEYS:
        logger.info(
            "preprocess: %s=%r is accepted for upstream compatibility and has no effect",
            key,
            getattr(config, key),
        )
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer_name_or_path)
    prompts = load_prompts(
        data_path=config.input,
        tokenizer=tokenizer,
        prompt_type=config.prompt_type,
        map_keys=config.map_keys,
        max_prompt_length=config.max_prompt_length,
        num_samples=config.num_samples,
        seed=config.seed,
    )
    if not prompts.records:
        raise ValueError(
            f"every prompt from {config.input} was dropped ({prompts.drops.summary()}); "
            "raise max_prompt_length or check map_keys"
        )
    _report_unknown_characters(tokenizer, prompts.records, config.input)
    path = write_prompt_file(
        prompts.records,
        output_prefix=config.output_prefix,
        prompt_type=config.prompt_type,
        output_format=config.output_format,
    )
    return path, prompts.drops


def _report_unknown_characters(tokenizer: Any, records: Sequence[PromptRecord], source: str) -> None:
    """Prompts that hold the tokenizer's unknown token are kept, and said so: two prompts that
    differ only in those characters look alike to the model."""
    num, chars = unknown_characters(tokenizer, records)
    if num:
        logger.warning(
            "preprocess: %d of %d prompts from %s hold characters this tokenizer encodes as its "
            "unknown token %r: %s; kept (use a tokenizer that covers them to tell them apart)",
            num, len(records), source, tokenizer.unk_token, describe_characters(chars),
        )  # fmt: skip
