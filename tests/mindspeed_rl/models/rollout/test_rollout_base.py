"""SamplingConfig parsing/validation, request validation, and the HF engine's token processing."""

from __future__ import annotations

import math

import pytest
import torch

from mindspeed_rl.models.rollout.base import (
    SamplingConfig,
    check_weight_names,
    resolve_max_tokens,
    sampling_config_from_mapping,
)
from mindspeed_rl.models.rollout.sampling import SamplingStep, processed_log_probs, sample_tokens


def test_upstream_sampling_config_parses() -> None:
    upstream = {
        "logprobs": 1,
        "max_tokens": 2048,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "temperature": 1.0,
    }
    cfg = sampling_config_from_mapping({**upstream, "detokenize": False})
    assert cfg == SamplingConfig(max_tokens=2048)


def test_misspelt_sampling_key_names_the_right_one() -> None:
    with pytest.raises(ValueError, match="did you mean 'temperature'"):
        sampling_config_from_mapping({"max_tokens": 8, "temperture": 0.5})
    with pytest.raises(ValueError, match="needs max_tokens"):
        sampling_config_from_mapping({"temperature": 0.5})


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", 0), ("temperature", -1.0), ("top_p", 0.0), ("top_k", 0), ("min_p", 2.0)],
)
def test_invalid_sampling_values_are_rejected(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**{"max_tokens": 4, field: value})  # type: ignore[arg-type]


def test_resolve_max_tokens_validates_each_prompt() -> None:
    cfg = SamplingConfig(max_tokens=10)
    assert resolve_max_tokens([[1, 2], [3]], cfg, None, 64) == [10, 10]
    assert resolve_max_tokens([[1, 2], [3]], cfg, [4, 60], 64) == [4, 60]
    with pytest.raises(ValueError, match="prompt 1 has 1 tokens"):
        resolve_max_tokens([[1, 2], [3]], cfg, [4, 64], 64)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        resolve_max_tokens([[]], cfg, None, 64)


def test_weight_names_must_match_exactly() -> None:
    check_weight_names(["a", "b"], frozenset({"a", "b"}))
    with pytest.raises(ValueError, match=r"missing \['b'\].*unexpected \['c'\]"):
        check_weight_names(["a", "c"], frozenset({"a", "b"}))


LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))


def _step(**kw: float) -> SamplingStep:
    base = {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0}
    return SamplingStep(**{**base, **kw})  # type: ignore[arg-type]


def test_temperature_scales_logits() -> None:
    got = processed_log_probs(LOGITS, _step(temperature=0.5))
    expected = torch.log_softmax(LOGITS / 0.5, dim=-1)
    assert torch.allclose(got, expected)


def test_top_k_top_p_min_p_renormalise_over_survivors() -> None:
    top2 = processed_log_probs(LOGITS, _step(top_k=2)).exp()[0]
    assert torch.allclose(top2, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    # top_p=0.8 keeps the smallest prefix reaching 0.8: {0.5, 0.3}.
    nucleus = processed_log_probs(LOGITS, _step(top_p=0.8)).exp()[0]
    assert torch.allclose(nucleus, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    # min_p=0.2 drops tokens below 0.2 * 0.5 = 0.1.
    min_p = processed_log_probs(LOGITS, _step(min_p=0.2)).exp()[0]
    assert torch.allclose(min_p, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)


def test_greedy_picks_argmax_with_raw_log_prob() -> None:
    step = _step(temperature=0.0)
    tokens, lps = sample_tokens(processed_log_probs(LOGITS, step), step, torch.Generator())
    assert tokens.tolist() == [0] and math.isclose(lps.item(), math.log(0.5), rel_tol=1e-6)


def test_cut_at_stop_sequences_keeps_the_prefix_through_the_first_stop() -> None:
    from mindspeed_rl.models.rollout.base import Completion, cut_at_stop_sequences

    c = Completion((1, 2, 3, 4, 2, 3), (-0.1, -0.2, -0.3, -0.4, -0.5, -0.6), "length")
    cut = cut_at_stop_sequences(c, [(4, 2), (2, 3)])
    assert cut == Completion((1, 2, 3), (-0.1, -0.2, -0.3), "stop")
    assert cut_at_stop_sequences(c, [(9, 9)]) is c
