"""DAPO's scorer (``acc_for_dapo``, its strict-box mode) and the soft overlong penalty, against
hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from mindspeed_rl.models.rewards import RewardConfig, build_reward_fn, get_verifier
from mindspeed_rl.models.rewards.dapo_math import (
    acc_for_dapo,
    acc_for_dapo_strict_box,
    normalize_answer,
)
from mindspeed_rl.models.rewards.overlong import OverlongPenalty


@pytest.mark.parametrize(
    ("response", "label", "score"),
    [
        ("so the total is 12.\nAnswer: 12", "12", 1.0),
        ("Answer: 11\n... wait, recount.\nAnswer: $\\boxed{12}$ dollars", "12", 1.0),  # the last one
        ("answer : \\frac12", "\\frac{1}{2}", 1.0),  # shorthand frac, case-insensitive marker
        ("Answer: x = 3", "3", 1.0),  # right-hand side of the last '='
        ("Answer: 1,000", "1000", 1.0),  # thousands separator of an integer
        ("Answer: 13", "12", -1.0),
        ("the answer is \\boxed{12}", "12", -1.0),  # no 'Answer:' marker: not graded as correct
        ("Answer: 12" + " filler" * 60, "12", -1.0),  # the marker is outside the last 300 chars
    ],
)
def test_acc_for_dapo(response: str, label: str, score: float) -> None:
    assert acc_for_dapo(response, label) == score


def test_normalisation_strips_units_and_markup() -> None:
    assert normalize_answer("\\text{5 inches}") == "5"
    assert normalize_answer("$90^\\circ$") == "90"
    assert normalize_answer("\\sqrt2") == "\\sqrt{2}"


def test_strict_box_compares_the_last_box_exactly() -> None:
    assert acc_for_dapo_strict_box("... \\boxed{1} then \\boxed{12}", "12") == 1.0
    assert acc_for_dapo_strict_box("\\boxed{12.0}", "12") == -1.0  # exact, no normalisation
    assert acc_for_dapo_strict_box("\\boxed{12}" + "x" * 100, "12") == -1.0  # outside the tail
    assert acc_for_dapo_strict_box("no box", "12") == -1.0


def test_registered_under_upstreams_name_in_process() -> None:
    assert get_verifier("acc_for_dapo") is acc_for_dapo
    reward = build_reward_fn(RewardConfig(verifier_function=("acc_for_dapo",), verifier_weight=(1.0,)))
    out = reward(["Answer: 4", "Answer: 5"], ["4", "4"])
    np.testing.assert_array_equal(out.rewards, [1.0, -1.0])


def test_overlong_penalty_ramps_over_the_buffer() -> None:
    penalty = OverlongPenalty(max_tokens=100, buffer=20, factor=0.5)
    # expected = 80: below it nothing, then -0.5 * (L - 80) / 20, capped at the buffer.
    got = penalty([10, 80, 81, 90, 100, 130])
    np.testing.assert_allclose(got, [0.0, 0.0, -0.025, -0.25, -0.5, -0.5])


@pytest.mark.parametrize("buffer", [0, 101])
def test_overlong_penalty_needs_a_buffer_inside_max_tokens(buffer: int) -> None:
    with pytest.raises(ValueError, match="overlong_buffer"):
        OverlongPenalty(max_tokens=100, buffer=buffer, factor=1.0)


def test_demo_exact_is_pass_fail() -> None:
    exact = get_verifier("demo_exact")
    assert exact("abc", "abc") == 1.0 and exact("abd", "abc") == 0.0
