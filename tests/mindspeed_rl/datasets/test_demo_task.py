import string

import numpy as np
import pytest

from mindspeed_rl.datasets.demo_task import (
    MAX_RESPONSE_CHARS,
    answer_for,
    demo_reward,
    demo_sft_pairs,
    generate_demo_prompts,
)


def test_prompts_are_deterministic_and_seeded() -> None:
    assert generate_demo_prompts(50, 3) == generate_demo_prompts(50, 3)
    assert generate_demo_prompts(50, 3) != generate_demo_prompts(50, 4)


def test_sft_pairs_come_from_a_different_stream() -> None:
    rl = [(d["prompt"], d["answer"]) for d in generate_demo_prompts(200, 0)]
    sft = demo_sft_pairs(200, 0)
    assert rl != sft
    # The task space is small (26 chars x counts), so single pairs may coincide; the streams may not.
    assert sum(a == b for a, b in zip(rl, sft)) < 20


def test_answers_follow_the_prompt() -> None:
    allowed = set(string.printable) - set("\t\r\x0b\x0c")
    for item in generate_demo_prompts(300, 1):
        char, count = item["prompt"][0], int(item["prompt"][2:-1])
        assert item["answer"] == char * count == answer_for(item["prompt"])
        assert set(item["prompt"] + item["answer"]) <= allowed
    assert answer_for("k*3=") == "kkk"


def test_response_lengths_are_heavy_tailed() -> None:
    lengths = np.array([len(d["answer"]) for d in generate_demo_prompts(3000, 0)])
    median, p99 = np.percentile(lengths, [50, 99])
    assert lengths.min() >= 1 and lengths.max() <= MAX_RESPONSE_CHARS
    assert median <= 12
    assert p99 >= 5 * median
    assert lengths.max() >= 100


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("abcd", "abcd", 1.0),
        ("abcd<|endoftext|>junk", "abcd", 1.0),  # eos text kept by the decoder: cut there
        ("abcd \n", "abcd", 1.0),  # trailing whitespace is not an error
        ("abxd", "abcd", 0.75),  # 3 of 4 positions match
        ("ab", "abcd", 0.5),  # stopped early: 2 matches / max(2, 4)
        ("abcdef", "abcd", 4 / 6),  # ran on: 4 matches / max(6, 4)
        ("", "abcd", 0.0),
        ("zzzz", "abcd", 0.0),
        ("bcd", "abcd", 0.0),  # positional: a dropped first char shifts every later one
    ],
)
def test_reward_partial_credit(response: str, answer: str, expected: float) -> None:
    assert demo_reward(response, answer) == pytest.approx(expected)


@pytest.mark.parametrize("prompt", ["K*3=", "k*=", "k3=", "kk*3=", "k*3"])
def test_malformed_prompt_is_rejected(prompt: str) -> None:
    with pytest.raises(ValueError, match="not a demo prompt"):
        answer_for(prompt)
