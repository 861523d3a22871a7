"""Token sampling for the HF engine, in vLLM's order, so both engines report the same log-probs.

Order (vLLM v1 sampler): EOS masked below min_tokens -> temperature -> min_p -> top_k -> top_p ->
log_softmax of what is left -> sample. Greedy rows (temperature 0) skip the temperature and the
truncations and report log_softmax of the raw logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_GREEDY_EPS = 1e-5  # vLLM treats temperatures below this as greedy


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingStep:
    temperature: float
    top_k: int
    top_p: float
    min_p: float


def processed_log_probs(logits: torch.Tensor, step: SamplingStep) -> torch.Tensor:
    """[rows, vocab] float32 logits (EOS already masked where needed) -> [rows, vocab] log-probs."""
    logits = logits.float()
    if step.temperature < _GREEDY_EPS:
        return torch.log_softmax(logits, dim=-1)
    logits = logits / step.temperature
    if step.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        threshold = step.min_p * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    if step.top_k > 0 and step.top_k < logits.shape[-1]:
        kth = torch.topk(logits, step.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if step.top_p < 1.0:
        logits = _mask_top_p(logits, step.top_p)
    return torch.log_softmax(logits, dim=-1)


def _mask_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    # Keep the smallest set of tokens whose mass reaches top_p (the top token always survives).
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= (1.0 - top_p)
    drop_sorted[..., -1] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_tokens(
    log_probs: torch.Tensor, step: SamplingStep, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (token ids [rows], their log-probs [rows])."""
    if step.temperature < _GREEDY_EPS:
        tokens = log_probs.argmax(dim=-1)
    else:
        tokens = torch.multinomial(log_probs.exp(), num_samples=1, generator=generator).squeeze(-1)
    return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
