"""Multi-turn loss masks on the real torch engine: tool-response tokens stay in the sequence (the
tokens after them are scored in their context) but no loss term (policy, KL, entropy) reaches the
logits that score them; the policy's tokens after them keep their gradient."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mindspeed_rl.models.loss import GRPOLossConfig
from mindspeed_rl.models.training.batch import TrainBatch, pad_batch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

PROMPT = [10, 11, 12, 13]
RESPONSE = [40, 41, 42, 70, 71, 72, 43, 44]  # model turn, tool response, model turn
MASK = [1, 1, 1, 0, 0, 0, 1, 1]
TOOL = [3, 4, 5]  # response positions of the tool response
AFTER = [6, 7]  # model tokens after it


def _engine(path: Path) -> TorchTrainingEngine:
    # KL in the loss and an entropy bonus, so all three terms would reach masked tokens if unmasked.
    loss = GRPOLossConfig(init_kl_coef=0.5, entropy_coeff=0.1)
    config = TorchEngineConfig(
        lr=1e-3, clip_grad=0.0, micro_batch_size=2, forward_micro_batch_size=2,
        mini_batch_size=1, n_samples_per_prompt=2, loss=loss, seed=3,
    )  # fmt: skip
    return TorchTrainingEngine(path, config)


def _hidden_grad(path: Path, masks: list[list[int]] | None) -> torch.Tensor:
    """Gradient of the final hidden states (each feeds only the logits of its own position) of
    sample 0 after one update, per response position."""
    engine = _engine(path)
    batch = TrainBatch.from_lists(
        prompt_ids=[PROMPT, PROMPT],
        response_ids=[RESPONSE, [40, 45]],
        advantages=[1.0, -1.0],
        loss_masks=masks,
    )
    old = engine.compute_log_probs(batch, 1.0)
    # Reference log-probs away from the policy's, so the KL term has a gradient everywhere.
    batch = batch.with_log_probs(old=old, ref=[lp - 0.3 for lp in old])
    captured: list[tuple[torch.Tensor, torch.Tensor]] = []

    def keep(
        module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object], output: object
    ) -> None:
        hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state  # type: ignore[attr-defined]
        hidden.retain_grad()
        ids = kwargs.get("input_ids", args[0] if args else None)
        assert isinstance(ids, torch.Tensor)
        captured.append((ids, hidden))

    handle = engine.model.model.register_forward_hook(keep, with_kwargs=True)
    try:
        engine.update(batch, 1.0)
    finally:
        handle.remove()
    (ids, hidden), *_ = [(i, h) for i, h in captured if h.grad is not None]
    sequence = torch.tensor(PROMPT + RESPONSE)
    # The engine orders micro-batch rows by length: find sample 0's row by its tokens.
    (row,) = [r for r in range(ids.shape[0]) if torch.equal(ids[r, : sequence.numel()], sequence)]
    positions = [len(PROMPT) - 1 + j for j in range(len(RESPONSE))]
    assert hidden.grad is not None
    return hidden.grad[row, positions].norm(dim=-1)


def test_tool_response_logits_get_zero_gradient_and_later_tokens_keep_theirs(tiny_model_path: Path) -> None:
    masked = _hidden_grad(tiny_model_path, [MASK, [1, 1]])
    assert torch.all(masked[TOOL] == 0), masked
    assert torch.all(masked[AFTER] > 0), masked
    assert torch.all(masked[:3] > 0), masked
    # Control: without the mask the same positions do receive gradient, so the check above can fail.
    unmasked = _hidden_grad(tiny_model_path, None)
    assert torch.all(unmasked[TOOL] > 0), unmasked


def test_masked_tokens_leave_the_update_unchanged_whatever_their_log_probs(tiny_model_path: Path) -> None:
    """Old and reference log-probs at tool positions do not matter (policy loss and KL skip them),
    and the token-mean normaliser counts the policy's tokens only."""
    grads = []
    for shift in (0.0, 3.0):
        engine = _engine(tiny_model_path)
        batch = TrainBatch.from_lists(
            prompt_ids=[PROMPT, PROMPT], response_ids=[RESPONSE, [40, 45]], advantages=[1.0, -1.0],
            loss_masks=[MASK, [1, 1]],
        )  # fmt: skip
        old = engine.compute_log_probs(batch, 1.0)
        bump = np.array([shift if m == 0 else 0.0 for m in MASK], dtype=np.float32)
        old[0] = old[0] + bump
        ref = [lp - 0.3 - (2 * bump if i == 0 else 0) for i, lp in enumerate(old)]
        metrics = engine.update(batch.with_log_probs(old=old, ref=ref), 1.0)
        grads.append({n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None})
        assert np.isfinite(list(metrics.values())).all()
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-7, rtol=1e-6)


def test_loss_mask_shapes_are_checked_and_padded() -> None:
    with pytest.raises(ValueError, match="loss_masks"):
        TrainBatch.from_lists(prompt_ids=[[1]], response_ids=[[2, 3]], advantages=[0.0], loss_masks=[[1]])
    batch = TrainBatch.from_lists(
        prompt_ids=[[1], [1]],
        response_ids=[[2, 3, 4], [5]],
        advantages=[0.0, 0.0],
        loss_masks=[[1, 0, 1], [1]],
    )
    assert batch.num_response_tokens == 4 and batch.num_loss_tokens == 3
    assert batch.select([1]).num_loss_tokens == 1
    padded = pad_batch(batch, pad_token_id=0)
    assert padded.policy_mask.tolist() == [[1, 0, 1], [1, 0, 0]]
    assert padded.response_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
