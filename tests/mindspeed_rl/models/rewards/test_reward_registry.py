import numpy as np
import pytest

from mindspeed_rl.models.rewards import RewardConfig, get_verifier, known_verifiers
from mindspeed_rl.models.rewards import build_reward_fn as _build


def build_reward_fn(names, weights):
    return _build(RewardConfig(verifier_function=names, verifier_weight=weights))


UPSTREAM_NAMES = ("acc", "base_acc", "math_17k_acc", "math_verify_reward", "format", "strict_format")


def test_upstream_and_task_names_are_registered():
    assert set(UPSTREAM_NAMES) | {"maze_integrity", "maze_correct", "demo"} <= set(known_verifiers())


def test_unknown_name_names_the_nearest_known_one():
    with pytest.raises(ValueError, match=r"'math_17k_acc'\?") as err:
        build_reward_fn(["math_17k_ac"], [1.0])
    assert "Known verifiers:" in str(err.value) and "maze_correct" in str(err.value)


@pytest.mark.parametrize(
    ("names", "weights", "match"),
    [
        (["acc", "format"], [1.0], "2 names .* 1 values"),
        ([], [], "empty"),
        (["acc", "acc"], [1.0, 1.0], "twice"),
        (["acc"], [float("nan")], "finite"),
    ],
)
def test_bad_name_weight_lists_are_rejected(names, weights, match):
    with pytest.raises(ValueError, match=match):
        build_reward_fn(names, weights)


def test_a_bare_string_is_rejected_instead_of_split_into_letters():
    with pytest.raises(ValueError, match=r"verifier_function: \['acc'\]"):
        build_reward_fn("acc", [1.0])  # type: ignore[arg-type]


def test_weighted_sum_and_per_verifier_scores():
    reward_fn = build_reward_fn(["acc", "format"], [1.0, 0.25])
    responses = [
        "<think>\nhalf of one\n</think>\nThe answer is \\boxed{\\frac{1}{2}}.",  # right, formatted
        "\\boxed{2}",  # wrong, unformatted
        "<think>\nguess\n</think>\n\\boxed{7}",  # wrong, formatted
    ]
    result = reward_fn(responses, ["0.5", "3", "8"])
    assert result.rewards.dtype == np.float64
    np.testing.assert_allclose(result.per_verifier["acc"], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(result.per_verifier["format"], [1.0, 0.0, 1.0])
    np.testing.assert_allclose(result.rewards, [1.25, 0.0, 0.25])


def test_length_mismatch_between_responses_and_labels_is_an_error():
    reward_fn = build_reward_fn(["acc"], [1.0])
    with pytest.raises(ValueError, match="2 responses but 1 labels"):
        reward_fn(["\\boxed{1}", "\\boxed{2}"], ["1"])


def test_empty_batch_gives_empty_arrays():
    result = build_reward_fn(["acc"], [1.0])([], [])
    assert result.rewards.shape == (0,) and result.per_verifier["acc"].shape == (0,)


def test_demo_verifier_resolves_lazily_to_the_demo_task():
    from mindspeed_rl.datasets import demo_task  # the project's own module: a plain import, never a skip

    assert get_verifier("demo") is demo_task.demo_reward
    prompts = demo_task.generate_demo_prompts(4, 0)
    reward_fn = build_reward_fn(["demo"], [1.0])
    answers = [p["answer"] for p in prompts]
    right = reward_fn(answers, answers).rewards
    wrong = reward_fn(["" for _ in answers], answers).rewards
    assert np.all(right > wrong)
