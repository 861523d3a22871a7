"""Prompt data: sources (JSONL / Parquet / built-in tasks), chat templates, tokenized records."""

from mindspeed_rl.datasets.loader import load_prompts
from mindspeed_rl.datasets.records import DropReport, PromptRecord, PromptSet, Tokenizer

__all__ = ["DropReport", "PromptRecord", "PromptSet", "Tokenizer", "load_prompts"]
