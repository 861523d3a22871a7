"""HFEngine beyond the shared contract (test_rollout_engine_contract.py): its input errors and the factory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_rollout_engine_contract import PROMPTS, load_reference

from mindspeed_rl.models.rollout import SamplingConfig, build_rollout_engine
from mindspeed_rl.models.rollout.hf_engine import HFEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> HFEngine:
    # Small chunks so the batched path with several chunks is exercised too.
    return HFEngine(str(tiny_model_dir), seed=0, max_num_seqs=4)


def test_unexpected_weight_names_are_rejected(engine: HFEngine, tiny_model_dir: Path) -> None:
    params = list(load_reference(tiny_model_dir).named_parameters())
    with pytest.raises(ValueError, match="unexpected"):
        engine.load_weights([*params, ("lm_head.bias", torch.zeros(128))])


def test_request_errors_name_the_fix(engine: HFEngine) -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate(PROMPTS, SamplingConfig(max_tokens=600))
    with pytest.raises(ValueError, match="one per prompt"):
        engine.generate(PROMPTS, SamplingConfig(max_tokens=4), max_tokens_per_prompt=[4])
    with pytest.raises(ValueError, match="vllm backend"):
        engine.generate(PROMPTS, SamplingConfig(max_tokens=4, repetition_penalty=1.1))
    with pytest.raises(ValueError, match="n=0"):
        engine.generate(PROMPTS, SamplingConfig(max_tokens=4), n=0)


def test_factory_builds_hf_engine_from_generate_config(tiny_model_dir: Path) -> None:
    config = {
        "dtype": "float32",
        "max_num_seqs": 8,
        "max_model_len": 64,
        "sampling_config": {"max_tokens": 4},
    }
    built = build_rollout_engine("hf", str(tiny_model_dir), config, seed=3)
    assert isinstance(built, HFEngine)
    with pytest.raises(ValueError, match="max_model_len 64"):
        built.generate([[2] * 60], SamplingConfig(max_tokens=8))
    with pytest.raises(ValueError, match="did you mean 'max_num_seqs'"):
        build_rollout_engine("hf", str(tiny_model_dir), {"max_num_seq": 8})
    with pytest.raises(ValueError, match="unknown rollout backend"):
        build_rollout_engine("sglang", str(tiny_model_dir), {})


def test_empty_stop_sequence_is_refused(engine: HFEngine) -> None:
    with pytest.raises(ValueError, match="empty sequence"):
        engine.generate([PROMPTS[0]], SamplingConfig(max_tokens=4), stop_token_sequences=[()])


def test_engine_turns_adapter_gives_one_turn_per_context(engine: HFEngine) -> None:
    from mindspeed_rl.tools.engines import EngineTurns

    turns = EngineTurns(engine, SamplingConfig(max_tokens=64, min_tokens=5, seed=1), [])
    out = turns.generate_turns([PROMPTS[0], PROMPTS[1]], [3, 5])
    assert [len(c.token_ids) <= cap for c, cap in zip(out, [3, 5])] == [True, True]
    assert all(c.loss_mask is None for c in out)
