"""The policy's HF tokenizer, read from its local folder (runs never reach for a hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(path: str | Path) -> Any:
    """Through the transformers adapter: a 4.x trainer environment reads a tokenizer a 5.x one saved."""
    from mindspeed_rl.models.transformers_compat import load_tokenizer as load

    return load(path)
