"""The policy's HF tokenizer, read from its local folder (runs never reach for a hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
