import pytest

from mindspeed_rl.datasets.templates import apply_template, known_prompt_types
from mindspeed_rl.models.rewards.format_verifiers import strict_format_reward


def test_empty_template_is_the_raw_prompt():
    assert apply_template("empty", "What is 2+2?") == "What is 2+2?"
    assert apply_template("empty", "What is 2+2?", system="Be brief.") == "Be brief.\nWhat is 2+2?"


def test_qwen3_is_chatml_ending_at_the_assistant_turn():
    text = apply_template("qwen3", "Hi", system="Sys")
    assert (
        text == "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert apply_template("qwen3", "Hi").startswith("<|im_start|>user\nHi")


def test_qwen_r1_asks_for_the_layout_the_verifiers_check():
    text = apply_template("qwen_r1", "What is 2+2?")
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert "What is 2+2?" in text and "<think>" in text and "</think>" in text and "\\boxed{}" in text
    # A response that does what the template asks satisfies the strictest format verifier.
    assert strict_format_reward("<think>\n2+2=4\n</think>\n\\boxed{4}", "4") == 1.0


def test_unknown_prompt_type():
    assert known_prompt_types() == ("empty", "qwen3", "qwen_r1")
    with pytest.raises(ValueError, match="did you mean 'qwen3'"):
        apply_template("qwen-3", "x")
