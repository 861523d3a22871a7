"""Maze verifiers (the paper's convergence-task rewards, §5.5).

- ``maze_integrity``: the response ends its answer with a well-formed, non-empty move sequence:
  the last ``<answer>...</answer>`` (else the last ``\\boxed{}``) holds only U/D/L/R (or
  up/down/left/right, any case), optionally separated by whitespace, commas or semicolons.
- ``maze_correct``: well formed AND every move stays on open cells AND the walk ends on ``G``.

The label is the maze JSON written by ``mindspeed_rl.datasets.maze_task.Maze.to_label``.
"""

from __future__ import annotations

import re

from mindspeed_rl.datasets.maze_task import Maze, walk
from mindspeed_rl.models.rewards.answer_extraction import last_boxed

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TOKEN_RE = re.compile(r"up|down|left|right|[udlr]", re.IGNORECASE)
_SEPARATORS_RE = re.compile(r"[\s,;]+")
_WORD_TO_MOVE = {"up": "U", "down": "D", "left": "L", "right": "R"}


def extract_moves(response: str) -> list[str] | None:
    """The move list of the final answer, or None when there is no well-formed answer."""
    answers = _ANSWER_RE.findall(response)
    text = answers[-1] if answers else last_boxed(response)
    if text is None:
        return None
    compact = _SEPARATORS_RE.sub("", text)
    tokens = _TOKEN_RE.findall(compact)
    if not tokens or "".join(tokens) != compact:
        return None
    return [_WORD_TO_MOVE.get(tok.lower(), tok.upper()) for tok in tokens]


def maze_integrity(response: str, label: str) -> float:
    del label  # well-formedness does not depend on the maze
    return 0.0 if extract_moves(response) is None else 1.0


def maze_correct(response: str, label: str) -> float:
    maze = Maze.from_label(label)  # a bad label is a dataset bug: let the ValueError surface
    moves = extract_moves(response)
    if moves is None:
        return 0.0
    return 1.0 if walk(maze, moves) == maze.goal else 0.0
