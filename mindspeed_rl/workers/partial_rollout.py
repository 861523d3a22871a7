"""Partial rollouts: one minibatch's responses continue across weight refreshes.

With ``rl_config.partial_rollout_max_split: N > 1`` an actor decodes a minibatch in rounds of at
most ``chunk_tokens`` new tokens per response. After each round it asks whether the Generation
Unit announced a newer converted snapshot; if so, and fewer than ``N - 1`` refreshes happened in
this minibatch, it reloads, and every unfinished response continues from prompt + partial response
on the new weights (the engine recomputes its KV cache from those tokens). Every token keeps the
version that produced it and its behaviour log-prob, as a run of ``TokenSegment``s.

Why rounds rather than stopping the engine mid-step: the public ``generate`` of vLLM (and of the HF
engine) cannot be paused, and a round boundary is a place where every open response has the same
number of new tokens, so ``min_tokens`` stays exact (one value per round). A refresh waits at most
one round. Rounds end as soon as no split is left: the rest of the minibatch runs in one call.
Continuing on the same weights changes nothing a response would sample (same logits, the
repetition penalty sees prompt + output either way); it costs one prefill of the partial response.

Pure logic over two callables, so the fake-engine tests cover it exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mindspeed_rl.contracts import PartialRollout
from mindspeed_rl.models.rollout.base import Completion, SamplingConfig
from mindspeed_rl.runtime.routing import append_rows
from mindspeed_rl.runtime.segments import TokenSegment, extend


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentedCompletion:
    completion: Completion
    segments: tuple[TokenSegment, ...]
    """Oldest first; one segment when the response never crossed a refresh."""


GenerateFn = Callable[[Sequence[Sequence[int]], SamplingConfig, int, Sequence[int]], list[list[Completion]]]
"""``engine.generate(prompts, sampling, n, max_tokens_per_prompt)``."""

RefreshFn = Callable[[], int | None]
"""Called between rounds: reload to the newest announced snapshot if it is newer; returns the
version now held if it changed, else None."""


@dataclass(slots=True)
class _Open:
    prompt: tuple[int, ...]
    limit: int
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    segments: tuple[TokenSegment, ...] = ()
    finish: str | None = None
    routing: Any = None
    """MoE routing so far (engines that record it): each round adds the rows of the positions it
    decoded, under the version it ran on (``runtime.routing.append_rows``)."""


def generate_in_segments(
    generate: GenerateFn,
    prompts: Sequence[Sequence[int]],
    limits: Sequence[int],
    *,
    n: int,
    sampling: SamplingConfig,
    config: PartialRollout,
    version: int,
    refresh: RefreshFn,
) -> list[list[SegmentedCompletion]]:
    """Decode ``n`` responses per prompt (``limits``: max_tokens per prompt), refreshing weights
    between rounds; returns ``[prompt][sample]`` completions."""
    if len(limits) != len(prompts):
        raise ValueError(f"{len(limits)} limits for {len(prompts)} prompts; pass one per prompt")
    opened = [_Open(prompt=tuple(p), limit=int(lim)) for p, lim in zip(prompts, limits) for _ in range(n)]
    splits, generated, rounds = 0, 0, 0
    while True:
        open_now = [o for o in opened if o.finish is None]
        if not open_now:
            break
        last_round = splits >= config.max_split - 1  # no refresh left: decode to the end at once
        round_sampling = _round_sampling(sampling, generated=generated, round_index=rounds)
        if rounds == 0:
            # One request per prompt with n samples: the engine shares the prompt's prefill.
            caps = [lim if last_round else min(lim, config.chunk_tokens) for lim in limits]
            out = generate([o.prompt for o in opened[::n]], round_sampling, n, caps)
            results = [c for per_prompt in out for c in per_prompt]
            caps = [cap for cap in caps for _ in range(n)]  # one per response, as open_now
        else:
            caps = [
                o.limit - len(o.tokens) if last_round else min(o.limit - len(o.tokens), config.chunk_tokens)
                for o in open_now
            ]
            out = generate([o.prompt + tuple(o.tokens) for o in open_now], round_sampling, 1, caps)
            results = [per_prompt[0] for per_prompt in out]
        if len(results) != len(open_now):
            raise RuntimeError(f"the engine returned {len(results)} responses for {len(open_now)} requests")
        for o, completion, cap in zip(open_now, results, caps):
            _take(o, completion, cap, version=version, max_split=config.max_split, final=last_round)
        # A response still open took exactly chunk_tokens this round (fewer means it finished).
        rounds, generated = rounds + 1, generated + config.chunk_tokens
        if last_round or all(o.finish is not None for o in opened):
            continue
        new_version = refresh()
        if new_version is not None:
            if new_version <= version:
                raise ValueError(
                    f"refresh reported version {new_version} after {version}; it must only load newer snapshots"
                )
            version, splits = new_version, splits + 1
    return [
        [
            SegmentedCompletion(
                completion=Completion(
                    tuple(o.tokens), tuple(o.log_probs), o.finish or "length", routing=o.routing
                ),  # finish: all set
                segments=o.segments,
            )
            for o in opened[i * n : (i + 1) * n]
        ]
        for i in range(len(prompts))
    ]


def _take(o: _Open, completion: Completion, cap: int, *, version: int, max_split: int, final: bool) -> None:
    """Append one round's tokens; the response is finished on EOS, at its own cap, or after a
    round that decoded to the end (``final``)."""
    if len(completion.token_ids) > cap:
        raise RuntimeError(f"the engine returned {len(completion.token_ids)} tokens for a cap of {cap}")
    o.tokens.extend(completion.token_ids)
    o.log_probs.extend(completion.log_probs)
    o.segments = extend(o.segments, version, len(completion.token_ids), max_split=max_split)
    if completion.routing is not None:
        o.routing = append_rows(o.routing, completion.routing)
    if final or completion.finish_reason == "stop" or len(o.tokens) >= o.limit:
        o.finish = completion.finish_reason


def _round_sampling(sampling: SamplingConfig, *, generated: int, round_index: int) -> SamplingConfig:
    """EOS stays masked only for what is left of ``min_tokens``; a seeded run draws a fresh,
    reproducible stream per round (the engine adds the request index)."""
    seed = None if sampling.seed is None else sampling.seed + 1_000_003 * round_index
    return dataclasses.replace(sampling, min_tokens=max(0, sampling.min_tokens - generated), seed=seed)
