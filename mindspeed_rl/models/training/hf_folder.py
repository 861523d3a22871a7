"""The non-weight files of an HF model folder (config, generation config, tokenizer, chat
template), carried into a folder an engine writes weights to so that folder loads on its own."""

from __future__ import annotations

import shutil
from pathlib import Path

NON_WEIGHT_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")


def copy_non_weight_files(source: Path, target: Path) -> None:
    """Copy ``source``'s non-weight files into ``target``; a file ``target`` already holds (the
    writer's own config or shard index) is kept, and a folder is never copied onto itself."""
    if target.resolve() == source.resolve():
        return
    for f in source.iterdir():
        copyable = f.is_file() and f.suffix in NON_WEIGHT_SUFFIXES and ".safetensors" not in f.name
        if copyable and not (target / f.name).exists():
            shutil.copy2(f, target / f.name)
