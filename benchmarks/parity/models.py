"""Random tiny HF checkpoints for the parity harnesses and the megatron tests: the project's
peaked models of each family, and a near-uniform Qwen2.5-shaped one (the shape that exposed the TP
entropy-gradient bug the peaked ones hid)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def build_parity_model(
    path: str | os.PathLike[str], family: str, *, tied: bool = False, seed: int = 0, num_layers: int = 2
) -> Path:
    """A random tiny HF checkpoint of ``family`` (qwen2 | qwen3 | qwen3_moe), shaped to exercise the
    mapping: GQA (4 heads, 2 groups), a vocabulary (100) that megatron must pad, a pad token
    (HF's embedding padding_idx) and, for qwen2, QKV bias. Weights are scaled up so log-probs are far from uniform."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    common: dict[str, Any] = {
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 256,
        "tie_word_embeddings": tied,
        "rms_norm_eps": 1e-6,
        # HF then embeds with padding_idx=0 (no gradient into row 0), which the megatron engine mirrors.
        "pad_token_id": 0,
    }
    configs: dict[str, Any] = {
        "qwen2": lambda: Qwen2Config(**common),
        "qwen3": lambda: Qwen3Config(**common),
        "qwen3_moe": lambda: Qwen3MoeConfig(
            **common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True
        ),
    }
    if family not in configs:
        raise ValueError(f"unknown family {family!r}; choose from {sorted(configs)}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(configs[family](), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)  # non-trivial norm weights: a swapped q/k norm would show
            else:
                p.normal_(0.0, 0.15)
    target = Path(path)
    model.save_pretrained(target)
    return target


def build_near_uniform_model(path: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """A random Qwen2.5-shaped checkpoint at transformers' own initialisation (weights N(0, 0.02),
    zero biases, unit norms), unlike :func:`build_parity_model`'s scaled-up weights: log-probs are
    near-uniform (~ -log 200), the regime where a vocab-parallel normaliser's gradient error is
    largest (peaked distributions hide it). Hidden 96, GQA 4 query / 2 kv heads (head_dim 24), QKV
    bias, vocabulary 200 (padded by megatron), untied, no pad token: none of the project's own
    choices."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=200,
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    target = Path(path)
    model.save_pretrained(target)
    return target
