"""Micro-batches through megatron's forward-backward schedule, and log-probs from its logits.

Shared by the policy (update, compute_log_probs) and the frozen reference. The data each rank sees::

    TrainBatch (every rank gets the whole batch)
      └─ DP rank d takes its slice (samples sorted by length, dealt in contiguous parts)
           └─ micro-batches, each padded to its own longest sample (k-th micro: the same width
              on every DP rank), widened by run_micros where the model needs more
                └─ forward_backward_func(forward_step, iter(micros), model, ...)
                     └─ last stage: vocab-parallel logits -> log-probs at the response tokens
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.utils.checkpoint

from mindspeed_rl.models.training.batch import PaddedBatch, TrainBatch, pad_batch
from mindspeed_rl.models.training.megatron import context_parallel, patches
from mindspeed_rl.models.training.megatron.vocab_parallel import vocab_parallel_log_probs

# Response tokens per log-prob chunk, as in the torch engine (``TorchEngineConfig.log_prob_chunk_tokens``).
LOGPROB_CHUNK_TOKENS = 1024

LossFn = Callable[["Micro", torch.Tensor], tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]]
"""``loss_fn(micro, logits) -> (loss, num_tokens, stats)``, called on the last pipeline stage."""

AroundForward = Callable[["Micro"], AbstractContextManager[None]]
"""Entered around each micro-batch's model call on every stage (routing replay sets the
micro-batch's routing there: ``routing_replay.ReplayPass.micro``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Micro:
    """One micro-batch: its rows' indices in the caller's batch and the padded tensors."""

    indices: np.ndarray
    batch: TrainBatch
    padded: PaddedBatch
    pad_token_id: int = 0


def plan_micros(
    batch: TrainBatch,
    *,
    dp_rank: int,
    dp_size: int,
    micro_batch_size: int,
    pad_token_id: int,
    device: torch.device,
) -> list[Micro]:
    """This DP rank's micro-batches; every rank gets the same count, the same rows per micro-batch,
    and the same width for its k-th micro-batch.

    Samples are sorted by length and dealt in contiguous runs (similar widths per rank). Micro-batch
    k is right-padded to the longest sample among the k-th micro-batches of all DP ranks (each rank
    has the whole batch, so no communication): short micro-batches do not pay for the batch's
    longest sample, and the values are those of any wider padding (right padding under a causal
    mask never reaches a real token). Equal shapes across ranks are what the MoE allgather
    dispatcher needs (it gathers equal token counts over EP ranks); :func:`run_micros` widens
    further where the pipeline or sequence parallelism needs it. Ranks short of rows fill with
    one-token dummy rows, which :func:`real_rows` drops before the loss.
    """
    lengths = np.array([p.size + r.size for p, r in zip(batch.prompt_ids, batch.response_ids)])
    parts = np.array_split(np.argsort(lengths, kind="stable"), dp_size)
    longest = max(part.size for part in parts)
    rows = min(micro_batch_size, longest)
    mine = parts[dp_rank]
    micros = []
    for k in range(-(-longest // rows)):
        width = max(int(lengths[part[k * rows : (k + 1) * rows]].max(initial=0)) for part in parts)
        indices = mine[k * rows : (k + 1) * rows]
        sub = _fill_rows(batch.select(indices), rows, pad_token_id)
        padded = pad_batch(sub, pad_token_id=pad_token_id, device=device)
        padded = widen(padded, max(width, padded.input_ids.shape[1]), pad_token_id)
        micros.append(Micro(indices=indices, batch=sub, padded=padded, pad_token_id=pad_token_id))
    return micros


def _fill_rows(batch: TrainBatch, rows: int, pad_token_id: int) -> TrainBatch:
    missing = rows - batch.num_samples
    if missing == 0:
        return batch
    one = np.full(1, pad_token_id, dtype=np.int64)
    zero = np.zeros(1, dtype=np.float32)

    def more(values: tuple[np.ndarray, ...] | None, filler: np.ndarray) -> tuple[np.ndarray, ...] | None:
        return None if values is None else values + (filler,) * missing

    routing = None
    if batch.routing is not None and batch.routing:
        # A filler row's single input position has no record (-1): the replay routes it anywhere.
        layers, top_k = batch.routing[0].shape[1:]
        routing = batch.routing + (np.full((1, layers, top_k), -1, dtype=np.int64),) * missing
    return TrainBatch(
        prompt_ids=batch.prompt_ids + (one,) * missing,
        response_ids=batch.response_ids + (one,) * missing,
        advantages=np.concatenate([batch.advantages, np.zeros(missing, dtype=np.float32)]),
        old_log_probs=more(batch.old_log_probs, zero),
        ref_log_probs=more(batch.ref_log_probs, zero),
        rollout_log_probs=more(batch.rollout_log_probs, zero),
        versions=more(batch.versions, np.zeros(1, dtype=np.int64)),
        loss_masks=more(batch.loss_masks, np.zeros(1, dtype=np.int64)),
        routing=routing,
    )


def real_rows(padded: PaddedBatch, count: int) -> PaddedBatch:
    """The first ``count`` rows (the real samples; the rest are :func:`plan_micros` fillers)."""

    def head(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[:count]

    return PaddedBatch(
        input_ids=padded.input_ids[:count],
        attention_mask=padded.attention_mask[:count],
        logit_index=padded.logit_index[:count],
        targets=padded.targets[:count],
        response_mask=padded.response_mask[:count],
        advantages=padded.advantages[:count],
        old_log_probs=head(padded.old_log_probs),
        ref_log_probs=head(padded.ref_log_probs),
        rollout_log_probs=head(padded.rollout_log_probs),
        versions=head(padded.versions),
        loss_mask=head(padded.loss_mask),
    )


def widen(padded: PaddedBatch, width: int, pad_token_id: int) -> PaddedBatch:
    """Right-pad the sequence axis to ``width`` (the response-aligned tensors stay as they are)."""
    extra = width - padded.input_ids.shape[1]
    if extra == 0:
        return padded
    return replace(
        padded,
        input_ids=torch.nn.functional.pad(padded.input_ids, (0, extra), value=pad_token_id),
        attention_mask=torch.nn.functional.pad(padded.attention_mask, (0, extra), value=0),
    )


def response_log_probs(
    logits: torch.Tensor,
    padded: PaddedBatch,
    temperature: float,
    *,
    vocab_size: int,
    with_entropy: bool,
    chunk_tokens: int = LOGPROB_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, R]`` log-probs (and entropy) of the response tokens from ``[B, S, V/tp]`` logits.

    Computed ``chunk_tokens`` response tokens at a time: the fp32 copy of a chunk's vocab-parallel
    logits and its softmax temporaries exist for one chunk only, and with gradients each chunk is
    recomputed in the backward pass (activation checkpointing) instead of saved, so no fp32
    ``[B, R, V/tp]`` tensor of a whole micro-batch is ever alive. The chunk's collectives run in the
    same order on every TP rank, in the forward and in the recompute alike.

    Under context parallelism ``logits`` holds this CP rank's positions only: each rank scores the
    response tokens whose logits it holds, and the ranks' shares are summed over the CP group
    (``context_parallel``), so every rank returns the whole ``[B, R]``."""
    from megatron.core import parallel_state as ps

    group = ps.get_tensor_model_parallel_group()
    vocab_start = ps.get_tensor_model_parallel_rank() * logits.shape[-1]
    logit_index, owned = context_parallel.owned_logit_index(padded.logit_index, padded.input_ids.shape[1])
    rows, width = logit_index.shape
    step = max(1, chunk_tokens // max(rows, 1))

    def chunk(logits: torch.Tensor, index: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
        gathered = torch.gather(logits, 1, index.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        logp, entropy = vocab_parallel_log_probs(
            gathered.float() / temperature, targets, vocab_start=vocab_start, vocab_size=vocab_size,
            group=group, with_entropy=with_entropy,
        )  # fmt: skip
        return (logp,) if entropy is None else (logp, entropy)

    parts = []
    for start in range(0, width, step):
        args = (logits, logit_index[:, start : start + step], padded.targets[:, start : start + step])
        if torch.is_grad_enabled() and logits.requires_grad:
            parts.append(torch.utils.checkpoint.checkpoint(chunk, *args, use_reentrant=False))
        else:
            parts.append(chunk(*args))
    logp = context_parallel.sum_owned(torch.cat([p[0] for p in parts], dim=1), owned)
    if not with_entropy:
        return logp, None
    return logp, context_parallel.sum_owned(torch.cat([p[1] for p in parts], dim=1), owned)


def _forward_step(
    loss_fn: LossFn,
    around: AroundForward | None,
    data: Any,
    model: torch.nn.Module,
) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
    micro: Micro = next(data)
    ids = micro.padded.input_ids
    mine = context_parallel.local_positions(ids.shape[1], ids.device)
    with around(micro) if around is not None else contextlib.nullcontext():
        if mine is None:
            positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
            output = model(ids, positions, patches.causal_attention_mask(ids.shape[1], ids.device))
        else:
            # This CP rank's positions only. The mask is the layer spec's causal type (TE and
            # MindSpeed build the cross-rank causal structure themselves); megatron's RotaryEmbedding
            # cuts its table to these positions (context_parallel docstring), position ids serve no
            # embedding.
            output = model(ids[:, mine], mine.expand(ids.shape[0], -1), None)
    return output, partial(loss_fn, micro)


def micro_widths(widths: Sequence[int], *, multiple: int = 1, uniform: bool = False) -> list[int]:
    """The width each micro-batch runs at: rounded up to ``multiple`` (sequence parallelism splits
    the sequence over TP ranks, context parallelism into its chunks), and all equal to the widest
    when ``uniform`` (a pipeline that sends fixed-shape activations, i.e. without
    ``variable_seq_lengths``)."""
    rounded = [-(-w // multiple) * multiple for w in widths]
    if uniform and rounded:
        return [max(rounded)] * len(rounded)
    return rounded


def _model_widths(model: torch.nn.Module, micros: Sequence[Micro]) -> list[int]:
    from megatron.core.utils import get_model_config

    config = get_model_config(model)
    multiple = config.tensor_model_parallel_size if config.sequence_parallel else 1
    # CP splits first, then SP splits each CP rank's part over TP: both must divide.
    multiple *= context_parallel.current().multiple
    uniform = config.pipeline_model_parallel_size > 1 and not config.variable_seq_lengths
    return micro_widths([m.padded.input_ids.shape[1] for m in micros], multiple=multiple, uniform=uniform)


def run_micros(
    model: torch.nn.Module,
    micros: Sequence[Micro],
    loss_fn: LossFn,
    *,
    forward_only: bool,
    around_forward: AroundForward | None = None,
) -> list[dict[str, torch.Tensor]]:
    """Run megatron's schedule over ``micros``; returns ``loss_fn``'s dicts (last stage only).

    ``loss_fn(micro, logits)`` returns ``(loss, num_tokens, stats)``; with
    ``calculate_per_token_loss`` the schedule back-propagates ``loss`` unscaled. ``loss_fn`` sees
    the micro-batch at the width it ran (:func:`micro_widths`); only its padding differs, and so
    does ``around_forward`` (entered around each model call, on every pipeline stage).
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if not micros:
        return []
    widths = _model_widths(model, micros)
    ran = [
        m if w == m.padded.input_ids.shape[1] else replace(m, padded=widen(m.padded, w, m.pad_token_id))
        for m, w in zip(micros, widths, strict=True)
    ]
    rows = micros[0].padded.input_ids.shape[0]
    with patches.cpu_runtime_mode():
        return list(
            get_forward_backward_func()(
                forward_step_func=partial(_forward_step, loss_fn, around_forward),
                data_iterator=iter(ran),
                model=[model],
                num_microbatches=len(ran),
                # Used only for fixed-shape pipelines, whose micro-batches all have this width.
                seq_length=max(widths),
                micro_batch_size=rows,
                forward_only=forward_only,
            )
        )
