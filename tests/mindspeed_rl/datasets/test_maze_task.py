import random

import pytest

from mindspeed_rl.datasets.maze_task import (
    GOAL,
    START,
    WALL,
    Maze,
    generate_maze,
    generate_maze_prompts,
    solve_maze,
    walk,
)
from mindspeed_rl.models.rewards.maze import maze_correct, maze_integrity


@pytest.mark.parametrize(("height", "width"), [(1, 2), (2, 2), (3, 5), (6, 4)])
def test_generated_mazes_are_enclosed_and_solvable(height, width):
    rng = random.Random(height * 10 + width)
    for _ in range(5):
        maze = generate_maze(height=height, width=width, rng=rng)
        assert len(maze.grid) == 2 * height + 1 and {len(r) for r in maze.grid} == {2 * width + 1}
        assert set(maze.grid[0]) == {WALL} and set(maze.grid[-1]) == {WALL}
        assert maze.grid[maze.start[0]][maze.start[1]] == START
        assert maze.grid[maze.goal[0]][maze.goal[1]] == GOAL
        path = solve_maze(maze)
        assert path, "a perfect maze connects every pair of rooms"
        assert walk(maze, list(path)) == maze.goal


def test_bfs_finds_the_shortest_path_not_just_any_path():
    # Two routes from S to G: 2 moves straight down, or 6 moves round the block.
    maze = Maze.from_label('{"grid": ["#####", "#S..#", "#.#.#", "#G..#", "#####"]}')
    assert solve_maze(maze) == "DD"


def test_unreachable_goal_gives_none():
    maze = Maze.from_label('{"grid": ["#####", "#S#G#", "#####"]}')
    assert solve_maze(maze) is None


def test_label_round_trip_and_prompts_are_deterministic():
    prompts = generate_maze_prompts(6, seed=3)
    assert prompts == generate_maze_prompts(6, seed=3)
    assert prompts != generate_maze_prompts(6, seed=4)
    for item in prompts:
        maze = Maze.from_label(item["answer"])
        assert "\n".join(maze.grid) in item["prompt"]
        solution = f"<answer>{' '.join(solve_maze(maze) or '')}</answer>"
        assert maze_integrity(solution, item["answer"]) == 1.0
        assert maze_correct(solution, item["answer"]) == 1.0


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match=">= 2 rooms"):
        generate_maze(height=1, width=1, rng=random.Random(0))
    with pytest.raises(ValueError, match="min_rooms"):
        generate_maze_prompts(3, seed=0, min_rooms=5, max_rooms=2)
