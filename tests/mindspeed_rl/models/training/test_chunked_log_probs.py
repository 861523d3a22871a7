"""Chunked log-softmax over the sequence: same values and gradients, bounded projection size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mindspeed_rl.models.training.batch import TrainBatch, pad_batch
from mindspeed_rl.models.training.log_probs import (
    chunked_log_probs,
    compute_response_log_probs,
    forward_with_entropy,
    response_logits,
    token_log_probs,
)
from mindspeed_rl.models.training.reference import load_causal_lm


def _batch() -> TrainBatch:
    rng = np.random.default_rng(0)
    prompts = [rng.integers(4, 100, size=k).tolist() for k in (3, 6, 2)]
    responses = [rng.integers(4, 100, size=k).tolist() for k in (9, 2, 5)]
    return TrainBatch.from_lists(prompt_ids=prompts, response_ids=responses, advantages=[0.0, 0.0, 0.0])


def _unchunked(
    model: torch.nn.Module, batch: TrainBatch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    padded = pad_batch(batch, pad_token_id=0)
    logits = response_logits(model, padded, temperature)
    log_p = torch.log_softmax(logits, dim=-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return token_log_probs(logits, padded.targets) * padded.response_mask, entropy * padded.response_mask


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def test_chunked_values_and_gradients_equal_the_unchunked_path(tiny_model_path: Path) -> None:
    model = load_causal_lm(tiny_model_path, "cpu")
    batch, temperature = _batch(), 0.7
    padded = pad_batch(batch, pad_token_id=0)
    ref_logp, ref_entropy = _unchunked(model, batch, temperature)
    (ref_logp.sum() + 0.1 * ref_entropy.sum()).backward()
    ref_grads = _grads(model)
    logp, entropy = forward_with_entropy(model, padded, temperature, entropy_grad=True, chunk_tokens=4)
    (logp.sum() + 0.1 * entropy.sum()).backward()
    grads = _grads(model)
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, rtol=0, atol=1e-5)
    assert grads.keys() == ref_grads.keys() and "lm_head.weight" in grads
    for name, grad in grads.items():
        torch.testing.assert_close(
            grad, ref_grads[name], rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
        )
    rows = compute_response_log_probs(
        model,
        batch,
        temperature=temperature,
        micro_batch_size=2,
        pad_token_id=0,
        device="cpu",
        chunk_tokens=3,
    )
    for i, row in enumerate(rows):
        np.testing.assert_allclose(row, ref_logp[i, : row.size].detach().numpy(), atol=1e-5)


def test_no_projection_sees_more_than_one_chunk_of_real_tokens(tiny_model_path: Path) -> None:
    model = load_causal_lm(tiny_model_path, "cpu")
    head = model.get_output_embeddings()
    seen: list[tuple[int, ...]] = []
    handle = head.register_forward_hook(lambda _m, _i, out: seen.append(tuple(out.shape)))
    batch = _batch()  # 16 real response tokens, padded to 3 x 9 = 27 slots
    padded = pad_batch(batch, pad_token_id=0)
    hidden = torch.randn(3, 9, 64)
    try:
        logp, entropy = chunked_log_probs(head, hidden, padded, 1.0, chunk_tokens=5)
        logp.sum().backward()  # the recompute in backward is chunked too
    finally:
        handle.remove()
    assert all(len(shape) == 2 and shape[0] <= 5 and shape[1] == 128 for shape in seen), seen
    assert sum(s[0] for s in seen) == 2 * batch.num_response_tokens  # forward + checkpoint recompute
    assert logp.shape == entropy.shape == (3, 9)
    assert bool((logp[padded.response_mask == 0] == 0).all())
