import json

import pytest

from mindspeed_rl.models.rewards.maze import extract_moves, maze_correct, maze_integrity

# S at (1,1), G at (3,3); the only way is right along the top then down the right column.
GRID = ["#####", "#S..#", "###.#", "#G..#", "#####"]
LABEL = json.dumps({"grid": GRID})


@pytest.mark.parametrize(
    ("response", "moves"),
    [
        ("<think>go right</think><answer>R R D D L L</answer>", ["R", "R", "D", "D", "L", "L"]),
        ("<answer>RRDDLL</answer>", ["R", "R", "D", "D", "L", "L"]),
        ("<answer>right, right, down</answer>", ["R", "R", "D"]),
        ("final: \\boxed{R R D}", ["R", "R", "D"]),
        ("<answer>R</answer> then <answer>D D</answer>", ["D", "D"]),  # the last answer counts
        ("<answer>R X D</answer>", None),
        ("<answer></answer>", None),
        ("<answer>R R D", None),  # unclosed
        ("R R D D L L", None),  # no answer tag
        ("", None),
    ],
)
def test_extract_moves(response, moves):
    assert extract_moves(response) == moves


@pytest.mark.parametrize(
    ("answer", "integrity", "correct"),
    [
        ("R R D D L L", 1.0, 1.0),
        ("R R D D L", 1.0, 0.0),  # legal but stops short of G
        ("D D", 1.0, 0.0),  # walks into a wall
        ("L", 1.0, 0.0),  # walks into the outer wall
        ("R R D D L L R", 1.0, 0.0),  # reaches G but walks on
        ("R R go D", 0.0, 0.0),
    ],
)
def test_integrity_and_correctness(answer, integrity, correct):
    response = f"<answer>{answer}</answer>"
    assert maze_integrity(response, LABEL) == integrity
    assert maze_correct(response, LABEL) == correct


def test_bad_maze_labels_raise_with_a_fix():
    with pytest.raises(ValueError, match="not JSON"):
        maze_correct("<answer>R</answer>", "RRDD")
    with pytest.raises(ValueError, match="exactly one 'G'"):
        maze_correct("<answer>R</answer>", json.dumps({"grid": ["#S.#"]}))
