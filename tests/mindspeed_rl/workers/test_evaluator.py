"""evaluate_policy on a tiny random model: live weights, pass@1, eval mode restored, prompt selection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mindspeed_rl.contracts import EvalConfig
from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.models.rewards import RewardConfig, build_reward_fn, register_verifier, unregister_verifier
from mindspeed_rl.models.rollout.base import SamplingConfig
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, build_char_tokenizer, create_tiny_model
from mindspeed_rl.models.training.reference import load_causal_lm
from mindspeed_rl.workers.evaluator import (
    EvalSettings,
    evaluate_policy,
    select_eval_prompts,
    write_eval_prompts,
)

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return create_tiny_model(tmp_path_factory.mktemp("eval") / "model", TINY_TEST_ARCH, seed=0)


@pytest.fixture
def model(model_dir: Path):
    loaded = load_causal_lm(model_dir, "cpu")
    loaded.train()
    return loaded


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module", autouse=True)
def _verifiers():
    # Scores that do not depend on the random model's text, so accuracy has a known value.
    register_verifier("test_full", lambda response, label: 1.0, bounded=True)
    register_verifier("test_half", lambda response, label: 0.5, bounded=True)
    yield
    unregister_verifier("test_full")
    unregister_verifier("test_half")


def _prompts(tokenizer, num: int) -> list[PromptRecord]:
    texts = [f"{c}*3=" for c in "abcdefgh"[:num]]
    return [
        PromptRecord(
            prompt_id=f"v{i}",
            text=t,
            token_ids=tuple(tokenizer.encode(t, add_special_tokens=False)),
            label="x",
        )
        for i, t in enumerate(texts)
    ]


def _settings(n: int = 2) -> EvalSettings:
    return EvalSettings(sampling=SamplingConfig(max_tokens=MAX_TOKENS), num_samples_per_prompt=n, seed=0)


def _reward(names, weights):
    return build_reward_fn(RewardConfig(verifier_function=tuple(names), verifier_weight=tuple(weights)))


def test_metrics_count_prompts_and_samples_and_the_model_is_left_as_found(model, tokenizer) -> None:
    attention = model.config._attn_implementation
    metrics = evaluate_policy(
        model, tokenizer, _prompts(tokenizer, 3), _reward(["test_full"], [1.0]), _settings(n=2)
    )
    assert metrics["eval/num_prompts"] == 3 and metrics["eval/num_samples"] == 6
    assert metrics["eval/accuracy"] == 1.0 and metrics["eval/num_timed_out"] == 0
    assert 1 <= metrics["eval/response_length"] <= MAX_TOKENS
    assert model.training and model.config._attn_implementation == attention


def test_correct_means_full_marks_from_every_verifier(model, tokenizer) -> None:
    prompts = _prompts(tokenizer, 2)
    partial = evaluate_policy(model, tokenizer, prompts, _reward(["test_half"], [1.0]), _settings())
    assert partial["eval/accuracy"] == 0.0 and partial["eval/reward_mean"] == 0.5
    mixed = evaluate_policy(
        model, tokenizer, prompts, _reward(["test_full", "test_half"], [1.0, 0.2]), _settings()
    )
    assert mixed["eval/accuracy"] == 0.0 and mixed["eval/reward_mean"] == pytest.approx(1.1)


def test_generation_uses_the_live_in_memory_weights(model, tokenizer) -> None:
    seen: list[str] = []
    register_verifier("test_records", lambda response, label: seen.append(response) or 1.0, bounded=True)
    try:
        reward_fn = _reward(["test_records"], [1.0])
        greedy = EvalSettings(
            sampling=SamplingConfig(max_tokens=MAX_TOKENS, temperature=0.0), num_samples_per_prompt=1, seed=0
        )
        evaluate_policy(model, tokenizer, _prompts(tokenizer, 4), reward_fn, greedy)
        before, seen[:] = list(seen), []
        evaluate_policy(model, tokenizer, _prompts(tokenizer, 4), reward_fn, greedy)
        assert seen == before  # greedy decoding is deterministic ...
        seen.clear()
        with torch.no_grad():  # ... so only the in-memory weight change can alter the responses
            model.lm_head.weight.copy_(torch.randn_like(model.lm_head.weight))
        evaluate_policy(model, tokenizer, _prompts(tokenizer, 4), reward_fn, greedy)
        assert seen != before
    finally:
        unregister_verifier("test_records")


def test_no_positive_weight_is_an_error(model, tokenizer) -> None:
    with pytest.raises(ValueError, match="no positive weight"):
        evaluate_policy(model, tokenizer, _prompts(tokenizer, 1), _reward(["test_full"], [-1.0]), _settings())


def test_prompt_selection_caps_and_refuses_an_empty_eval_set(tokenizer) -> None:
    valid = _prompts(tokenizer, 5)
    assert select_eval_prompts(valid, EvalConfig()) == ()
    assert [p.prompt_id for p in select_eval_prompts(valid, EvalConfig(interval=2, max_prompts=3))] == [
        "v0",
        "v1",
        "v2",
    ]
    assert len(select_eval_prompts(valid, EvalConfig(interval=2))) == 5
    with pytest.raises(ValueError, match="split: '90,10,0'"):
        select_eval_prompts([], EvalConfig(interval=2))


def test_eval_interval_counts_from_one_like_megatron() -> None:
    assert [i for i in range(12) if EvalConfig(interval=5).due(i)] == [4, 9]
    assert not any(EvalConfig().due(i) for i in range(12))
    with pytest.raises(ValueError, match="eval_interval=0"):
        EvalConfig(interval=0)


def test_eval_prompt_ids_are_appended_per_evaluation(tmp_path: Path) -> None:
    write_eval_prompts(tmp_path, 4, ["v0", "v1"])
    write_eval_prompts(tmp_path, 9, ["v0", "v1"])
    rows = [json.loads(line) for line in (tmp_path / "eval_prompts.jsonl").read_text().splitlines()]
    assert rows == [
        {"iteration": 4, "prompt_ids": ["v0", "v1"]},
        {"iteration": 9, "prompt_ids": ["v0", "v1"]},
    ]
