"""Per-token log-probs of response tokens under an HF causal LM, shared by policy and reference.

Definition (identical to the rollout engines'): ``log_softmax(logits / temperature)`` gathered at
the sampled token, with top_p = 1 / top_k = -1, i.e. no truncation of the distribution.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from mindspeed_rl.models.training.batch import PaddedBatch, TrainBatch, pad_batch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from mindspeed_rl.models.moe_routing import ReplayStats


def check_temperature(temperature: float) -> None:
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 to define log-probs; got {temperature}. Use the rollout's "
            "generate_config.sampling_config.temperature (greedy decoding has no log-prob ratio)."
        )


def response_logits(model: torch.nn.Module, padded: PaddedBatch, temperature: float) -> torch.Tensor:
    """Temperature-scaled logits ``[B, R, V]`` at the positions that score each response token.

    The unchunked form (all ``B x R x V`` logits at once): SFT warm-up on short pairs uses it, and
    tests check ``chunked_log_probs`` against it."""
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


def scoring_hidden_states(model: PreTrainedModel, padded: PaddedBatch) -> torch.Tensor:
    """Final hidden states ``[B, R, H]`` at the positions whose logits score each response token.

    The decoder runs without its LM head, so no ``[B, T, V]`` logits exist; this assumes
    ``logits = lm_head(hidden)`` (true of the Qwen/Llama families: no logit scaling or capping).
    """
    with replayed_routing(model, padded):
        out = model.base_model(
            input_ids=padded.input_ids, attention_mask=padded.attention_mask, use_cache=False
        )
    hidden = out.last_hidden_state
    index = padded.logit_index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
    return torch.gather(hidden, 1, index)


_STATS_ATTR = "_routing_replay_stats"


@contextlib.contextmanager
def replayed_routing(model: torch.nn.Module, padded: PaddedBatch) -> Iterator[None]:
    """Route the forward inside by ``padded.routing`` (MoE routing replay); nothing without it.
    Replay statistics add up on ``collect_replay_stats``'s record while one is open."""
    if padded.routing is None:
        yield
        return
    from mindspeed_rl.models.moe_routing import RouterHooks, padded_routing

    hooks = RouterHooks(model)
    routing = padded_routing(
        padded.routing, padded.input_ids.shape[1], hooks.num_layers, hooks.top_k, padded.input_ids.device
    )
    with hooks.replay(routing) as stats:
        yield
    total = getattr(model, _STATS_ATTR, None)
    if total is not None:
        total.add(stats)


@contextlib.contextmanager
def collect_replay_stats(model: torch.nn.Module) -> Iterator[ReplayStats]:
    """The replay statistics of every replayed forward of ``model`` inside the block."""
    from mindspeed_rl.models.moe_routing import ReplayStats

    stats = ReplayStats()
    setattr(model, _STATS_ATTR, stats)
    try:
        yield stats
    finally:
        delattr(model, _STATS_ATTR)


def _chunk_terms(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    log_p = torch.log_softmax(head(hidden).float() / temperature, dim=-1)
    logp = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    lp = log_p if entropy_grad else log_p.detach()
    return logp, -(lp.exp() * lp).sum(dim=-1)


def chunked_log_probs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    padded: PaddedBatch,
    temperature: float,
    *,
    chunk_tokens: int,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies ``[B, R]`` (0 at padded slots), ``chunk_tokens`` tokens at a time.

    Only real response tokens are projected. With autograd on, each chunk runs under activation
    checkpointing: its fp32 logits are freed after the forward and recomputed in the backward,
    so peak memory is one chunk's ``chunk_tokens x V`` whatever the micro-batch length, and the
    gradients are exactly those of the unchunked computation.
    """
    flat = hidden.reshape(-1, hidden.shape[-1])
    valid = padded.response_mask.reshape(-1).nonzero().squeeze(-1)
    h, t = flat.index_select(0, valid), padded.targets.reshape(-1).index_select(0, valid)
    logps, entropies = [], []
    for start in range(0, h.shape[0], chunk_tokens):
        piece = (h[start : start + chunk_tokens], t[start : start + chunk_tokens])
        if torch.is_grad_enabled():
            logp, entropy = checkpoint(
                _chunk_terms, head, *piece, temperature, entropy_grad, use_reentrant=False
            )
        else:
            logp, entropy = _chunk_terms(head, *piece, temperature, entropy_grad)
        logps.append(logp)
        entropies.append(entropy)
    shape, size = padded.response_mask.shape, padded.response_mask.numel()

    def scatter(values: list[torch.Tensor]) -> torch.Tensor:
        out = torch.zeros(size, dtype=torch.float32, device=hidden.device)
        return out.index_put((valid,), torch.cat(values)).reshape(shape)

    return scatter(logps), scatter(entropies)


def forward_with_entropy(
    model: PreTrainedModel,
    padded: PaddedBatch,
    temperature: float,
    *,
    entropy_grad: bool,
    chunk_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs ``[B, R]`` (with grad) and per-token entropy (with grad only if ``entropy_grad``)."""
    hidden = scoring_hidden_states(model, padded)
    return chunked_log_probs(
        model.get_output_embeddings(),
        hidden,
        padded,
        temperature,
        chunk_tokens=chunk_tokens,
        entropy_grad=entropy_grad,
    )


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
    model: PreTrainedModel,
    batch: TrainBatch,
    *,
    temperature: float,
    micro_batch_size: int,
    pad_token_id: int,
    device: torch.device | str,
    chunk_tokens: int = 1024,
    routing_out: list[np.ndarray | None] | None = None,
) -> list[np.ndarray]:
    """One float32 array of response-token log-probs per sample, run ``micro_batch_size`` at a time.

    ``routing_out`` (a list of ``batch.num_samples`` slots): filled with each sample's MoE routing
    as this forward routed it (replayed where ``batch.routing`` says so), ``runtime.routing`` rows."""
    check_temperature(temperature)
    was_training = model.training
    model.eval()
    result: list[np.ndarray | None] = [None] * batch.num_samples
    try:
        for indices, micro in micro_batches(batch, micro_batch_size):
            padded = pad_batch(micro, pad_token_id=pad_token_id, device=device)
            if routing_out is None:
                hidden = scoring_hidden_states(model, padded)
            else:
                hidden = _scoring_with_capture(model, padded, micro, indices, routing_out)
            head = model.get_output_embeddings()
            logp = chunked_log_probs(head, hidden, padded, temperature, chunk_tokens=chunk_tokens)[0].cpu()
            for row, (i, r) in enumerate(zip(indices, micro.response_ids)):
                result[int(i)] = logp[row, : r.size].numpy().copy()
    finally:
        model.train(was_training)
    assert all(x is not None for x in result)
    return [x for x in result if x is not None]


def _scoring_with_capture(
    model: PreTrainedModel,
    padded: PaddedBatch,
    micro: TrainBatch,
    indices: np.ndarray,
    routing_out: list[np.ndarray | None],
) -> torch.Tensor:
    from mindspeed_rl.models.moe_routing import RouterHooks, stack_calls

    hooks = RouterHooks(model)
    # The replay hook runs first whatever the order (``RouterHooks.replay`` prepends it), so the
    # capture sees the experts the forward actually used.
    with replayed_routing(model, padded), hooks.capture() as calls:
        out = model.base_model(
            input_ids=padded.input_ids, attention_mask=padded.attention_mask, use_cache=False
        )
    hidden = out.last_hidden_state
    used = stack_calls(calls, 0).reshape(*padded.input_ids.shape, hooks.num_layers, hooks.top_k).cpu()
    for row, (i, p, r) in enumerate(zip(indices, micro.prompt_ids, micro.response_ids)):
        routing_out[int(i)] = used[row, : p.size + r.size - 1].numpy().copy()
    index = padded.logit_index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
    return torch.gather(hidden, 1, index)
