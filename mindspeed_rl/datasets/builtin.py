"""Built-in generated prompt sources, addressed as ``data_path: builtin:<task>``.

Generated rows go through the same template / tokenize / filter path as file rows, so a
``builtin:`` source behaves exactly like a file holding the same prompts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from mindspeed_rl.datasets.sources import RawRow

BUILTIN_PREFIX = "builtin:"
# task -> (module, generator); generators take (num, seed) and return [{"prompt", "answer"}].
# Imported on use: the demo task module is optional for anyone not running the demo.
_GENERATORS: dict[str, tuple[str, str]] = {
    "demo": ("mindspeed_rl.datasets.demo_task", "generate_demo_prompts"),
    "demo_short": ("mindspeed_rl.datasets.demo_task", "generate_demo_short_prompts"),
    "arith_tools": ("mindspeed_rl.datasets.arith_tools_task", "generate_arith_tools_prompts"),
    "maze": ("mindspeed_rl.datasets.maze_task", "generate_maze_prompts"),
}


def is_builtin(data_path: str) -> bool:
    return data_path.startswith(BUILTIN_PREFIX)


def builtin_rows(data_path: str, *, num: int, seed: int) -> list[RawRow]:
    """``num`` generated rows with columns ``prompt`` and ``answer`` and ids ``<task>-s<seed>-<i>``."""
    task = data_path[len(BUILTIN_PREFIX) :]
    if task not in _GENERATORS:
        raise ValueError(
            f"unknown built-in source {data_path!r}; known: {', '.join(BUILTIN_PREFIX + t for t in sorted(_GENERATORS))}"
        )
    module_name, attr = _GENERATORS[task]
    generate: Callable[[int, int], list[dict[str, str]]] = getattr(importlib.import_module(module_name), attr)
    rows = generate(num, seed)
    if len(rows) != num:
        raise ValueError(f"built-in generator {task!r} returned {len(rows)} prompts for num={num}")
    return [
        RawRow(values=values, location=f"{data_path} item {i}", default_id=f"{task}-s{seed}-{i}")
        for i, values in enumerate(rows)
    ]
