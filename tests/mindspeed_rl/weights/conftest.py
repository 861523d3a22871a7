from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


def make_tiny_model(seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-named tensors of mixed dtypes, shaped so every TP split below divides evenly."""
    gen = torch.Generator().manual_seed(seed)
    hidden, ffn, vocab = 8, 12, 16
    return {
        "model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(hidden, hidden, generator=gen),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(hidden, generator=gen),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(hidden, hidden, generator=gen),
        "model.layers.0.mlp.gate_proj.weight": torch.randn(ffn, hidden, generator=gen).to(torch.bfloat16),
        "model.layers.0.mlp.down_proj.weight": torch.randn(hidden, ffn, generator=gen).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.rand(hidden, generator=gen),
        "model.norm.weight": torch.rand(hidden, generator=gen),
        "lm_head.weight": torch.randn(vocab, hidden, generator=gen),
        "model.step_counter": torch.tensor(7, dtype=torch.int64),
    }


@pytest.fixture
def tiny_model() -> dict[str, torch.Tensor]:
    return make_tiny_model()


@pytest.fixture
def model_factory() -> Callable[[int], dict[str, torch.Tensor]]:
    return make_tiny_model
