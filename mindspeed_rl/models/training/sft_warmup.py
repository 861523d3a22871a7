"""Supervised warm-up: teacher-forced cross-entropy on the response (+ eos) only.

A freshly initialised tiny model cannot produce a single valid answer, so GRPO would see all-zero
reward groups. A short SFT stage on task pairs makes it *partially* competent, which gives GRPO
reward variance within groups to learn from. The model folder is overwritten in place.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from mindspeed_rl.models import transformers_compat
from mindspeed_rl.models.loss.aggregate import masked_token_mean
from mindspeed_rl.models.training.batch import TrainBatch, pad_batch
from mindspeed_rl.models.training.log_probs import response_logits, token_log_probs
from mindspeed_rl.models.training.reference import load_causal_lm


class Tokenizer(Protocol):
    eos_token_id: int

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def tokenize_pairs(tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]]) -> TrainBatch:
    """Prompt ids as-is (no template) and target ids + eos as the response to learn."""
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p, _ in pairs]
    targets = [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for _, t in pairs]
    return TrainBatch.from_lists(prompt_ids=prompts, response_ids=targets, advantages=np.zeros(len(pairs)))


def length_bucketed_batches(
    lengths: np.ndarray, *, batch_size: int, num_batches: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """``num_batches`` index batches of similar sequence length, in random order.

    Lengths are heavy-tailed: a uniformly drawn batch is padded to its rare long member and most of
    the compute goes to padding. Sorting within windows of many batches keeps batches homogeneous
    while every pass still visits each pair once in a random order.
    """
    window = batch_size * 64
    batches: list[np.ndarray] = []
    while len(batches) < num_batches:
        perm = rng.permutation(lengths.size)
        epoch: list[np.ndarray] = []
        for start in range(0, perm.size, window):
            chunk = perm[start : start + window]
            chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
            epoch.extend(chunk[i : i + batch_size] for i in range(0, chunk.size, batch_size))
        batches.extend(epoch[i] for i in rng.permutation(len(epoch)))
    return batches[:num_batches]


def sft_warmup(
    model_path: str | os.PathLike[str],
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    device: str = "cpu",
) -> dict[str, float]:
    """Train ``steps`` AdamW steps on length-bucketed batches of ``pairs``; save back to ``model_path``.

    Returns ``loss_first`` (first step), ``loss_last`` (mean of the last 10% of steps), ``steps``,
    ``seconds`` and ``tokens_per_s`` (response tokens trained per second).
    """
    if steps < 1 or batch_size < 1 or lr <= 0 or not pairs:
        raise ValueError(
            f"sft_warmup needs steps >= 1, batch_size >= 1, lr > 0 and some pairs; got steps={steps}, "
            f"batch_size={batch_size}, lr={lr}, {len(pairs)} pairs"
        )
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    data = tokenize_pairs(tokenizer, pairs)
    model = load_causal_lm(model_path, device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    lengths = np.array([p.size + r.size for p, r in zip(data.prompt_ids, data.response_ids)])
    losses: list[float] = []
    num_tokens = 0
    start = time.perf_counter()
    for indices in length_bucketed_batches(lengths, batch_size=batch_size, num_batches=steps, rng=rng):
        micro = data.select(indices)
        padded = pad_batch(micro, pad_token_id=0, device=device)
        logp = token_log_probs(response_logits(model, padded, 1.0), padded.targets)
        loss = -masked_token_mean(logp, padded.response_mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.item()))
        num_tokens += micro.num_response_tokens
    seconds = time.perf_counter() - start
    model.save_pretrained(Path(model_path))
    transformers_compat.write_portable_config(model_path)  # read alike by transformers 4.x and 5.x
    tail = max(1, steps // 10)
    return {
        "loss_first": losses[0],
        "loss_last": float(np.mean(losses[-tail:])),
        "steps": float(steps),
        "seconds": seconds,
        "tokens_per_s": num_tokens / seconds,
    }
