import string

import numpy as np
import pytest

from mindspeed_rl.datasets.demo_task import (
    MAX_RESPONSE_CHARS,
    apply_operation,
    demo_reward,
    demo_sft_pairs,
    generate_demo_prompts,
)


def _parse(prompt: str) -> tuple[str, str]:
    assert prompt.endswith("=")
    op, text = prompt[:-1].split(":", 1)
    return op, text


def test_prompts_are_deterministic_and_seeded() -> None:
    assert generate_demo_prompts(50, 3) == generate_demo_prompts(50, 3)
    assert generate_demo_prompts(50, 3) != generate_demo_prompts(50, 4)


def test_sft_pairs_come_from_a_different_stream() -> None:
    rl = [(d["prompt"], d["answer"]) for d in generate_demo_prompts(200, 0)]
    sft = demo_sft_pairs(200, 0)
    assert rl != sft
    assert len(set(rl) & set(sft)) < 40  # only short prompts can coincide by chance


def test_answers_follow_the_stated_operation() -> None:
    allowed = set(string.printable) - set("\t\r\x0b\x0c")
    for item in generate_demo_prompts(300, 1):
        op, text = _parse(item["prompt"])
        assert item["answer"] == apply_operation(op, text)
        assert set(item["prompt"] + item["answer"]) <= allowed
    assert apply_operation("rev", "abc") == "cba"
    assert apply_operation("rep3", "ab") == "ababab"
    assert apply_operation("up", "ab") == "AB"


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


def test_unknown_operation_is_rejected() -> None:
    with pytest.raises(ValueError, match="cp, up, rev"):
        apply_operation("sort", "abc")
