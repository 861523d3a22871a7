"""Held-out evaluation's two halves on a tiny random model: a rollout engine decodes
(``decode_held_out``, on a generation actor), the trainer scores (``score_held_out``); prompt
selection and the eval_prompts log."""

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
from mindspeed_rl.workers.evaluator import (
    EvalRequest,
    EvalSettings,
    HeldOutDecode,
    score_held_out,
    select_eval_prompts,
    write_eval_prompts,
)
from mindspeed_rl.workers.generation_actor import GenerationActor
from tests.support.plans import hf_rollout_spec

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return create_tiny_model(tmp_path_factory.mktemp("eval") / "model", TINY_TEST_ARCH, seed=0)


@pytest.fixture(scope="module")
def actor(model_dir: Path) -> GenerationActor:
    """A generation actor on the HF engine; its own sampling (4 tokens) is not the evaluation's."""
    spec = hf_rollout_spec(model_dir, "generate_config.sampling_config.max_tokens=4")
    prompt = PromptRecord(prompt_id="p0", text="cp:ab=", token_ids=(5, 6, 7), label="ab")
    return GenerationActor(spec, str(model_dir), {"p0": prompt}, gu_id=0, actor_id=0)


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


def _prompts(tokenizer, num: int) -> tuple[PromptRecord, ...]:
    texts = [f"{c}*3=" for c in "abcdefgh"[:num]]
    return tuple(
        PromptRecord(
            prompt_id=f"v{i}",
            text=t,
            token_ids=tuple(tokenizer.encode(t, add_special_tokens=False)),
            label="x",
        )
        for i, t in enumerate(texts)
    )


def _settings(n: int = 2, temperature: float = 1.0, seed: int = 0) -> EvalSettings:
    sampling = SamplingConfig(max_tokens=MAX_TOKENS, temperature=temperature)
    return EvalSettings(sampling=sampling, num_samples_per_prompt=n, seed=seed)


def _reward(names, weights):
    return build_reward_fn(RewardConfig(verifier_function=tuple(names), verifier_weight=tuple(weights)))


def _decoded(responses: list[tuple[int, ...]], reasons: list[str] | None = None) -> HeldOutDecode:
    return HeldOutDecode(
        job_id=0,
        responses=tuple(responses),
        finish_reasons=tuple(reasons or ["stop"] * len(responses)),
        weights_version=3,
        generate_s=0.5,
    )


def test_an_actor_decodes_n_samples_per_prompt_with_the_evaluations_sampling(actor, tokenizer) -> None:
    prompts = _prompts(tokenizer, 3)
    decoded = actor.decode_held_out(EvalRequest(prompts=prompts, settings=_settings(n=2)).job(7, 0))
    assert decoded.job_id == 7 and decoded.weights_version == actor.policy_version == 0
    assert len(decoded.responses) == len(decoded.finish_reasons) == 6
    # The evaluation's own max_tokens (6), not the actor's rollout setting (4).
    assert all(1 <= len(r) <= MAX_TOKENS for r in decoded.responses)
    assert any(len(r) > 4 for r in decoded.responses)
    metrics = score_held_out(decoded, prompts, tokenizer, _reward(["test_full"], [1.0]))
    assert metrics["eval/num_prompts"] == 3 and metrics["eval/num_samples"] == 6
    assert metrics["eval/accuracy"] == 1.0 and metrics["eval/num_timed_out"] == 0
    assert metrics["eval/weights_version"] == 0


def test_the_decode_is_seeded_and_reads_the_weights_the_actor_holds(actor, tokenizer) -> None:
    prompts = _prompts(tokenizer, 4)
    request = EvalRequest(prompts=prompts, settings=_settings(n=2, seed=11))
    first = actor.decode_held_out(request.job(0, 0)).responses
    assert actor.decode_held_out(request.job(1, 0)).responses == first  # same seed, same weights
    other_seed = EvalRequest(prompts=prompts, settings=_settings(n=2, seed=12))
    assert actor.decode_held_out(other_seed.job(2, 0)).responses != first
    model = actor._engine.model  # type: ignore[attr-defined]
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        changed = dict(saved)
        changed["lm_head.weight"] = torch.randn_like(saved["lm_head.weight"]) * 5
        actor.load_weights(changed.items(), version=1)
        again = actor.decode_held_out(request.job(3, 1))
        assert again.weights_version == 1 and again.responses != first
    finally:
        actor.load_weights(saved.items(), version=2)


def test_an_actor_refuses_to_decode_older_weights_than_the_job_names(actor, tokenizer) -> None:
    job = EvalRequest(prompts=_prompts(tokenizer, 1), settings=_settings()).job(0, actor.policy_version + 1)
    with pytest.raises(ValueError, match="reload before decoding"):
        actor.decode_held_out(job)


def test_correct_means_full_marks_from_every_verifier(tokenizer) -> None:
    prompts = _prompts(tokenizer, 2)
    decoded = _decoded([(5, 6), (7,), (8, 9, 10), (5,)], ["stop", "length", "stop", "stop"])
    partial = score_held_out(decoded, prompts, tokenizer, _reward(["test_half"], [1.0]))
    assert partial["eval/accuracy"] == 0.0 and partial["eval/reward_mean"] == 0.5
    assert partial["eval/response_length"] == 1.75 and partial["eval/truncated_fraction"] == 0.25
    mixed = score_held_out(decoded, prompts, tokenizer, _reward(["test_full", "test_half"], [1.0, 0.2]))
    assert mixed["eval/accuracy"] == 0.0 and mixed["eval/reward_mean"] == pytest.approx(1.1)
    assert mixed["eval/weights_version"] == 3 and mixed["time/eval_generate_s"] == 0.5


def test_scores_need_a_positive_weight_and_the_same_samples_per_prompt(tokenizer) -> None:
    with pytest.raises(ValueError, match="no positive weight"):
        score_held_out(_decoded([(5,)]), _prompts(tokenizer, 1), tokenizer, _reward(["test_full"], [-1.0]))
    with pytest.raises(ValueError, match="3 decoded responses for 2 prompts"):
        score_held_out(_decoded([(5,)] * 3), _prompts(tokenizer, 2), tokenizer, _reward(["test_full"], [1.0]))
    with pytest.raises(ValueError, match="num_samples_per_prompt=0"):
        _settings(n=0)


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
