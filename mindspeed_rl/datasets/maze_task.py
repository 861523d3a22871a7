"""The maze task: generator, BFS solver, label encoding and prompts.

The paper evaluates convergence on a maze dataset (§5.5, rewards "maze integrity" and "maze
correctness"). We pose our own version of that task: a character grid (``#`` wall, ``.`` open,
``S`` start, ``G`` goal), and the answer is a sequence of moves ``U``/``D``/``L``/``R`` (one grid
character per move) inside ``<answer>...</answer>``. The label is the maze as JSON, so the
verifier can replay any path rather than compare against one reference path.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

WALL, OPEN, START, GOAL = "#", ".", "S", "G"
MOVES: dict[str, tuple[int, int]] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Maze:
    """A rectangular maze; ``start`` and ``goal`` are (row, col) of open cells."""

    grid: tuple[str, ...]
    start: tuple[int, int]
    goal: tuple[int, int]

    def is_open(self, row: int, col: int) -> bool:
        inside = 0 <= row < len(self.grid) and 0 <= col < len(self.grid[row])
        return inside and self.grid[row][col] != WALL

    def to_label(self) -> str:
        return json.dumps({"grid": list(self.grid)})

    @classmethod
    def from_label(cls, label: str) -> Maze:
        """Parse a label written by ``to_label``; raises ValueError when it is not a maze."""
        try:
            data = json.loads(label)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"maze label is not JSON ({err}); labels must be written by Maze.to_label, "
                'e.g. {"grid": ["#####", "#S.G#", "#####"]}'
            ) from err
        grid = data.get("grid") if isinstance(data, dict) else None
        if not isinstance(grid, list) or not grid or not all(isinstance(r, str) for r in grid):
            raise ValueError(
                'maze label needs a non-empty "grid" list of row strings; regenerate the dataset'
            )
        return cls(grid=tuple(grid), start=_find_one(grid, START), goal=_find_one(grid, GOAL))


def _find_one(grid: Sequence[str], symbol: str) -> tuple[int, int]:
    cells = [(r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch == symbol]
    if len(cells) != 1:
        raise ValueError(f"maze grid must contain exactly one {symbol!r}, found {len(cells)}; fix the label")
    return cells[0]


def generate_maze(*, height: int, width: int, rng: random.Random) -> Maze:
    """A perfect maze of ``height`` x ``width`` rooms (grid of 2h+1 x 2w+1 characters).

    Randomised depth-first carving gives exactly one path between any two rooms, so the BFS
    solution is the unique simple path and its length varies widely with the start/goal draw.
    """
    if height < 1 or width < 1 or height * width < 2:
        raise ValueError(f"maze needs >= 1 room per side and >= 2 rooms in all, got {height}x{width}")
    cells = [[WALL] * (2 * width + 1) for _ in range(2 * height + 1)]
    stack = [(0, 0)]
    visited = {(0, 0)}
    cells[1][1] = OPEN
    while stack:
        row, col = stack[-1]
        options = [
            (row + dr, col + dc)
            for dr, dc in MOVES.values()
            if 0 <= row + dr < height and 0 <= col + dc < width and (row + dr, col + dc) not in visited
        ]
        if not options:
            stack.pop()
            continue
        nrow, ncol = rng.choice(options)
        cells[row + nrow + 1][col + ncol + 1] = OPEN  # the wall between the two rooms
        cells[2 * nrow + 1][2 * ncol + 1] = OPEN
        visited.add((nrow, ncol))
        stack.append((nrow, ncol))
    rooms = [(2 * r + 1, 2 * c + 1) for r in range(height) for c in range(width)]
    start, goal = rng.sample(rooms, 2)
    cells[start[0]][start[1]] = START
    cells[goal[0]][goal[1]] = GOAL
    return Maze(grid=tuple("".join(row) for row in cells), start=start, goal=goal)


def solve_maze(maze: Maze) -> str | None:
    """Shortest move string from start to goal (BFS), or None when the goal is unreachable."""
    parents: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {maze.start: None}
    queue = deque([maze.start])
    while queue:
        cell = queue.popleft()
        if cell == maze.goal:
            return _backtrack(parents, cell)
        for move, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if nxt not in parents and maze.is_open(*nxt):
                parents[nxt] = (cell, move)
                queue.append(nxt)
    return None


def _backtrack(
    parents: dict[tuple[int, int], tuple[tuple[int, int], str] | None], cell: tuple[int, int]
) -> str:
    moves: list[str] = []
    link = parents[cell]
    while link is not None:
        cell, move = link
        moves.append(move)
        link = parents[cell]
    return "".join(reversed(moves))


def walk(maze: Maze, moves: Sequence[str]) -> tuple[int, int] | None:
    """Final cell after the moves, or None as soon as a move hits a wall or leaves the grid."""
    row, col = maze.start
    for move in moves:
        dr, dc = MOVES[move]
        row, col = row + dr, col + dc
        if not maze.is_open(row, col):
            return None
    return row, col


def maze_prompt(maze: Maze) -> str:
    rows = "\n".join(maze.grid)
    return (
        "Find a path through the maze below from S to G. '#' is a wall and '.' is open floor.\n"
        "Each move goes one character: U (up), D (down), L (left), R (right).\n"
        f"{rows}\n"
        "Reply with the moves inside <answer></answer>, for example <answer>R R D</answer>."
    )


def generate_maze_prompts(
    num: int, seed: int, *, min_rooms: int = 2, max_rooms: int = 5
) -> list[dict[str, str]]:
    """``num`` maze prompts (keys ``prompt`` and ``answer``, the answer being the JSON label)."""
    if num < 0 or not 2 <= min_rooms <= max_rooms:
        raise ValueError(
            f"need num >= 0 and 2 <= min_rooms <= max_rooms, got {num}, {min_rooms}, {max_rooms}"
        )
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        maze = generate_maze(
            height=rng.randint(min_rooms, max_rooms), width=rng.randint(min_rooms, max_rooms), rng=rng
        )
        out.append({"prompt": maze_prompt(maze), "answer": maze.to_label()})
    return out
