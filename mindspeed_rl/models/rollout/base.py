"""The rollout-engine interface shared by the vLLM and HF `generate` backends.

Log-prob definition (both engines, and what the trainer must reproduce):
    `Completion.log_probs[t]` is the log-probability of the sampled token under the distribution it
    was actually sampled from — the behaviour policy. That is vLLM's `processed_logprobs`:
    logits -> EOS masked while fewer than `min_tokens` were generated -> divided by `temperature`
    -> min_p, top_k, top_p truncation -> log_softmax. With upstream's default sampling_config
    (top_k=-1, top_p=1, min_p=0) and min_tokens=0 this is exactly `log_softmax(logits / T)`, the
    quantity a GRPO trainer computes for the policy at temperature T. Greedy decoding
    (temperature 0) returns `log_softmax(logits)`, as vLLM does.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingConfig:
    """Upstream `generate_config.sampling_config`, plus the keys trace replay needs."""

    max_tokens: int
    """Response-length cap; `generate(max_tokens_per_prompt=...)` overrides it per prompt."""
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = -1
    """-1 disables top-k."""
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    """vLLM backend only (the HF engine rejects values other than 1.0)."""
    logprobs: int = 1
    """Accepted for upstream compatibility; engines always return the sampled token's log-prob
    (the only one GRPO uses) and no top-k alternatives."""
    min_tokens: int = 0
    """EOS is masked until this many tokens exist; capped per prompt at that prompt's max_tokens."""
    ignore_eos: bool = False
    """Keep generating past EOS; with it, every response is exactly max_tokens long."""
    seed: int | None = None
    """Makes a call reproducible: prompt i, sample j uses seed + i * n + j. None: engine's stream."""
    detokenize: bool = False
    """Accepted for upstream compatibility; completions carry token ids only."""

    def __post_init__(self) -> None:
        checks = (
            (self.max_tokens >= 1, "max_tokens must be >= 1"),
            (self.temperature >= 0.0, "temperature must be >= 0 (0 = greedy)"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (self.top_k == -1 or self.top_k >= 1, "top_k must be -1 (off) or >= 1"),
            (0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]"),
            (self.repetition_penalty > 0.0, "repetition_penalty must be > 0 (1.0 = off)"),
            (self.logprobs >= 0, "logprobs must be >= 0"),
            (self.min_tokens >= 0, "min_tokens must be >= 0"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(f"sampling_config: {message}; got {self!r}")


@dataclass(frozen=True, slots=True)
class Completion:
    """One sampled response."""

    token_ids: tuple[int, ...]
    """Response tokens only; includes the final EOS when finish_reason is "stop"."""
    log_probs: tuple[float, ...]
    """Per-token behaviour-policy log-probs (see the module docstring)."""
    finish_reason: str
    """"stop" (EOS sampled) or "length" (max_tokens reached)."""
    _: KW_ONLY  # the optional records by name only: two of them, both optional, are easy to swap
    loss_mask: tuple[int, ...] | None = None
    """Multi-turn rollouts: 1 for the policy's own tokens, 0 for tool-response tokens (context
    only, log-prob 0); None = every token is the policy's."""
    routing: Any = None
    """Engines started to record MoE routing: ``[prompt + response - 1, moe_layers, top_k]`` int64
    expert ids (numpy; the row convention is ``runtime.routing``'s); None otherwise."""

    def __post_init__(self) -> None:
        assert len(self.token_ids) == len(self.log_probs), "one log-prob per token"
        assert self.finish_reason in ("stop", "length"), self.finish_reason
        assert self.loss_mask is None or len(self.loss_mask) == len(self.token_ids), (
            "one mask value per token"
        )


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        n: int = 1,
        max_tokens_per_prompt: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """Sample `n` responses per prompt; result is indexed [prompt][sample]."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace all weights in place (HF parameter names, every parameter present)."""
        ...

    def load_weights_from_path(self, path: str) -> None:
        """Replace all weights in place from a folder of safetensors in HF naming."""
        ...

    def shutdown(self) -> None: ...


def sampling_config_from_mapping(mapping: Mapping[str, Any]) -> SamplingConfig:
    """Build a `SamplingConfig` from upstream's `sampling_config` dict; unknown keys are errors."""
    known = [f.name for f in fields(SamplingConfig)]
    for key in mapping:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"valid keys: {known}"
            raise ValueError(f"unknown sampling_config key {key!r}; {hint}")
    if "max_tokens" not in mapping:
        raise ValueError("sampling_config needs max_tokens; add sampling_config.max_tokens to the YAML")
    return SamplingConfig(**dict(mapping))


def resolve_max_tokens(
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    max_tokens_per_prompt: Sequence[int] | None,
    max_model_len: int,
) -> list[int]:
    """Per-prompt max_tokens, validated so no engine ever truncates a request silently."""
    if max_tokens_per_prompt is None:
        limits = [sampling.max_tokens] * len(prompts)
    else:
        if len(max_tokens_per_prompt) != len(prompts):
            raise ValueError(
                f"max_tokens_per_prompt has {len(max_tokens_per_prompt)} entries for "
                f"{len(prompts)} prompts; pass one per prompt"
            )
        limits = [int(m) for m in max_tokens_per_prompt]
    for i, (prompt, limit) in enumerate(zip(prompts, limits)):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        if limit < 1:
            raise ValueError(f"max_tokens for prompt {i} is {limit}; it must be >= 1")
        if len(prompt) + limit > max_model_len:
            raise ValueError(
                f"prompt {i} has {len(prompt)} tokens + max_tokens {limit} > max_model_len "
                f"{max_model_len}; shorten the prompt, lower max_tokens or raise max_model_len"
            )
    return limits


def cut_at_stop_sequences(completion: Completion, sequences: Sequence[Sequence[int]]) -> Completion:
    """The completion ended right after the first of ``sequences`` it contains ("stop"), or as it
    was. Tokens sampled after that point are dropped; the kept prefix and its log-probs are exactly
    what a decode that stopped there would have produced."""
    tokens = completion.token_ids
    ends = [
        start + len(seq)
        for seq in sequences
        for start in range(len(tokens) - len(seq) + 1)
        if tuple(tokens[start : start + len(seq)]) == tuple(seq)
    ]
    if not ends:
        return completion
    end = min(ends)
    mask = None if completion.loss_mask is None else completion.loss_mask[:end]
    # Routing rows cover prompt + response - 1 positions: the dropped tail's rows go with it.
    routing = completion.routing
    if routing is not None:
        routing = routing[: len(routing) - (len(tokens) - end)]
    return Completion(tokens[:end], completion.log_probs[:end], "stop", loss_mask=mask, routing=routing)


def check_num_samples(n: int) -> None:
    if n < 1:
        raise ValueError(f"n={n}: the number of samples per prompt must be >= 1")


def check_weight_names(names: Iterable[str], expected: frozenset[str]) -> None:
    """Reject partial or misnamed weight updates: they would leave stale weights behind."""
    got = set(names)
    missing, unexpected = sorted(expected - got), sorted(got - expected)
    if missing or unexpected:
        raise ValueError(
            f"weight update does not match the model: missing {missing[:5]} ({len(missing)}), "
            f"unexpected {unexpected[:5]} ({len(unexpected)}); send every parameter under its HF name"
        )
