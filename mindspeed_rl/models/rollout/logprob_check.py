"""Trainer-side log-probs of rollout tokens from a plain HF forward pass, to check an engine against.

This is the quantity a GRPO trainer computes for the policy at temperature T (`base.py` defines
it); the engines must agree with it right after a weight sync, or the importance ratios are off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from mindspeed_rl.models.rollout.base import Completion


@torch.no_grad()
def reference_log_probs(
    model: PreTrainedModel, prompt: Sequence[int], response: Sequence[int], temperature: float = 1.0
) -> list[float]:
    """log softmax(logits / T) of each response token, from one unpadded forward of prompt+response."""
    if temperature <= 0.0:
        raise ValueError(f"temperature={temperature}: the reference needs T > 0 (greedy has no policy ratio)")
    ids = torch.tensor([[*prompt, *response]], dtype=torch.long, device=model.device)
    logits = model(input_ids=ids).logits[0].float()
    # Position k predicts token k+1, so response token j is scored at position len(prompt)+j-1.
    scored = logits[len(prompt) - 1 : ids.shape[1] - 1] / temperature
    log_probs = torch.log_softmax(scored, dim=-1)
    target = torch.tensor(list(response), dtype=torch.long, device=model.device)
    return log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1).tolist()


def max_log_prob_diff(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[Completion]],
    temperature: float = 1.0,
) -> float:
    """Largest |engine log-prob - reference log-prob| over every sampled token."""
    worst = 0.0
    for prompt, samples in zip(prompts, completions, strict=True):
        for c in samples:
            ref = reference_log_probs(model, prompt, c.token_ids, temperature)
            worst = max([worst, *(abs(a - b) for a, b in zip(ref, c.log_probs, strict=True))])
    return worst
