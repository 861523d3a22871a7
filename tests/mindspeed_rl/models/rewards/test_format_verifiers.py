import pytest

from mindspeed_rl.models.rewards.format_verifiers import format_reward, strict_format_reward

GOOD = "<think>\nAdd the two numbers.\n</think>\nThe sum is \\boxed{5}."


@pytest.mark.parametrize(
    ("response", "loose", "strict"),
    [
        (GOOD, 1.0, 1.0),
        ("Add the two numbers.\n</think>\nThe sum is \\boxed{5}.", 1.0, 0.0),  # primed <think>
        ("<think>Add.</think> The sum is 5.", 1.0, 0.0),  # no newlines, no box
        ("<think>\nAdd.\n</think>\n\\boxed{5} or \\boxed{6}", 1.0, 0.0),  # two boxes
        ("<think>\nAdd.\n</think>\n", 0.0, 0.0),  # no answer after reasoning
        ("<think>\n\n</think>\n\\boxed{5}", 0.0, 0.0),  # empty reasoning
        ("The sum is \\boxed{5}.", 0.0, 0.0),  # no reasoning block
        ("<think>\na\n</think>\n<think>\nb\n</think>\n\\boxed{5}", 0.0, 0.0),  # two blocks
        ("<think>\nnever closed \\boxed{5}", 0.0, 0.0),  # truncated response
        ("", 0.0, 0.0),
    ],
)
def test_format_and_strict_format(response, loose, strict):
    assert format_reward(response, "5") == loose
    assert strict_format_reward(response, "5") == strict
