"""Per-token log-probs of response tokens under an HF causal LM, shared by policy and reference.

Definition (identical to the rollout engines'): ``log_softmax(logits / temperature)`` gathered at
the sampled token, with top_p = 1 / top_k = -1, i.e. no truncation of the distribution.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from mindspeed_rl.models.loss.entropy import entropy_from_logits
from mindspeed_rl.models.training.batch import PaddedBatch, TrainBatch, pad_batch


def check_temperature(temperature: float) -> None:
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 to define log-probs; got {temperature}. Use the rollout's "
            "generate_config.sampling_config.temperature (greedy decoding has no log-prob ratio)."
        )


def response_logits(model: torch.nn.Module, padded: PaddedBatch, temperature: float) -> torch.Tensor:
    """Temperature-scaled logits ``[B, R, V]`` at the positions that score each response token."""
    width = padded.input_ids.shape[1]
    # Only positions from the earliest response-scoring one onward need logits; logits_to_keep
    # spares the [B, T, V] tensor over long prompts while staying model-agnostic.
    first = int(padded.logit_index[:, 0].min().item())
    out = model(
        input_ids=padded.input_ids,
        attention_mask=padded.attention_mask,
        logits_to_keep=width - first,
        use_cache=False,
    )
    logits = out.logits
    index = (padded.logit_index - first).unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    return torch.gather(logits, 1, index).float() / temperature


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.gather(torch.log_softmax(logits, dim=-1), -1, targets.unsqueeze(-1)).squeeze(-1)


def forward_with_entropy(
    model: torch.nn.Module, padded: PaddedBatch, temperature: float, *, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs ``[B, R]`` (with grad) and per-token entropy (with grad only if ``entropy_grad``)."""
    logits = response_logits(model, padded, temperature)
    logp = token_log_probs(logits, padded.targets)
    entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return logp, entropy


def micro_batches(batch: TrainBatch, size: int) -> Iterator[tuple[np.ndarray, TrainBatch]]:
    """``(indices, micro_batch)`` pairs covering ``batch``, grouped by similar sequence length.

    Every micro-batch is padded to its longest member; with heavy-tailed response lengths, grouping
    in sequence order would waste most compute on padding. The loss normaliser is the mini-batch
    token count, so the summed gradient does not depend on how samples are split into micro-batches.
    """
    lengths = np.array([p.size + r.size for p, r in zip(batch.prompt_ids, batch.response_ids)])
    order = np.argsort(lengths, kind="stable")
    for start in range(0, batch.num_samples, size):
        indices = order[start : start + size]
        yield indices, batch.select(indices)


@torch.no_grad()
def compute_response_log_probs(
    model: torch.nn.Module,
    batch: TrainBatch,
    *,
    temperature: float,
    micro_batch_size: int,
    pad_token_id: int,
    device: torch.device | str,
) -> list[np.ndarray]:
    """One float32 array of response-token log-probs per sample, run ``micro_batch_size`` at a time."""
    check_temperature(temperature)
    was_training = model.training
    model.eval()
    result: list[np.ndarray | None] = [None] * batch.num_samples
    try:
        for indices, micro in micro_batches(batch, micro_batch_size):
            padded = pad_batch(micro, pad_token_id=pad_token_id, device=device)
            logp = token_log_probs(response_logits(model, padded, temperature), padded.targets).cpu()
            for row, (i, r) in enumerate(zip(indices, micro.response_ids)):
                result[int(i)] = logp[row, : r.size].numpy().copy()
    finally:
        model.train(was_training)
    assert all(x is not None for x in result)
    return [x for x in result if x is not None]
