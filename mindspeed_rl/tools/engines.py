"""Adapters from rollout engines and tokenizers to what the agent loop needs."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mindspeed_rl.models.rollout.base import Completion, SamplingConfig


class TokenizerCodec:
    """A HF tokenizer as the loop's codec: no special tokens added, none skipped (the parser
    must see ``<tool_call>`` even where a tokenizer marks it special)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False)) if text else []

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=False))


class EngineTurns:
    """One turn per context from an engine whose ``generate`` takes ``stop_token_sequences``
    (``HFEngine``): each turn may stop right after the tool-call close marker."""

    def __init__(
        self, engine: Any, sampling: SamplingConfig, stop_token_sequences: Sequence[Sequence[int]]
    ) -> None:
        self._engine = engine
        # min_tokens would forbid EOS early in every turn; it is meant for a whole response.
        self._sampling = dataclasses.replace(sampling, min_tokens=0)
        self._stops = [tuple(s) for s in stop_token_sequences if s]

    def with_sampling(self, sampling: SamplingConfig) -> EngineTurns:
        """The same engine and stops with other sampling (held-out evaluation's seeded one)."""
        return EngineTurns(self._engine, sampling, self._stops)

    def generate_turns(
        self, contexts: Sequence[Sequence[int]], max_tokens: Sequence[int]
    ) -> list[Completion]:
        # sampling_config.max_tokens caps one turn; the loop's caps are what the total budget leaves.
        caps = [min(cap, self._sampling.max_tokens) for cap in max_tokens]
        out = self._engine.generate(
            contexts, self._sampling, n=1, max_tokens_per_prompt=caps, stop_token_sequences=self._stops
        )
        return [per_prompt[0] for per_prompt in out]
