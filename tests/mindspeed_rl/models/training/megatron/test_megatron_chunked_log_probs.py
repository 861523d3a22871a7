"""Response log-probs of the megatron engine, chunk by chunk (recomputed in backward), equal the
one-shot computation in values and gradients."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from mindspeed_rl.models.training.batch import TrainBatch, pad_batch
from mindspeed_rl.models.training.megatron.forward import response_log_probs


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """megatron's parallel state of a single TP rank, without importing megatron."""
    state = types.SimpleNamespace(
        get_tensor_model_parallel_group=lambda: None, get_tensor_model_parallel_rank=lambda: 0
    )
    core = types.ModuleType("megatron.core")
    core.parallel_state = state  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron", types.ModuleType("megatron"))
    monkeypatch.setitem(sys.modules, "megatron.core", core)


def _padded(vocab: int) -> object:
    rng = np.random.default_rng(0)
    lengths = [(3, 9), (5, 4), (2, 11)]
    batch = TrainBatch(
        prompt_ids=[rng.integers(0, vocab, p) for p, _ in lengths],
        response_ids=[rng.integers(0, vocab, r) for _, r in lengths],
        advantages=np.zeros(len(lengths), dtype=np.float32),
    )
    return pad_batch(batch, pad_token_id=0)


@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunks_match_one_shot_in_values_and_gradients(one_rank: None, with_entropy: bool) -> None:
    vocab = 37
    padded = _padded(vocab)
    seq = padded.input_ids.shape[1]  # type: ignore[attr-defined]
    base = torch.randn(3, seq, vocab + 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    weights = torch.randn(3, padded.targets.shape[1], dtype=torch.float64)  # type: ignore[attr-defined]
    results = []
    for chunk_tokens in (4, 1 << 20):  # 4 tokens over 3 rows: one response position per chunk
        logits = base.clone().to(torch.float32).requires_grad_(True)
        logp, entropy = response_log_probs(
            logits,
            padded,
            0.7,
            vocab_size=vocab,
            with_entropy=with_entropy,
            chunk_tokens=chunk_tokens,  # type: ignore[arg-type]
        )
        loss = (logp * weights).sum() + ((entropy * weights).sum() if entropy is not None else 0.0)
        loss.backward()
        assert logits.grad is not None
        results.append((logp.detach(), None if entropy is None else entropy.detach(), logits.grad))
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    torch.testing.assert_close(lp_a, lp_b, rtol=1e-6, atol=1e-6)
    if with_entropy:
        torch.testing.assert_close(ent_a, ent_b, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g_a, g_b, rtol=1e-6, atol=1e-6)
    assert g_a[..., vocab:].abs().max() == 0  # padding columns get no gradient
