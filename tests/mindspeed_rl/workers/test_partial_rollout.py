"""Partial rollouts, pure logic: rounds, refreshes between them, per-token versions.

The fake engine answers prompt + partial response deterministically: each response's target
length is its prompt's first token, every token it emits is the version it holds (so a test sees
which weights produced which token) and its log-prob is ``-version - 0.5``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mindspeed_rl.contracts import PartialRollout
from mindspeed_rl.models.rollout.base import Completion, SamplingConfig
from mindspeed_rl.runtime.segments import TokenSegment
from mindspeed_rl.workers.partial_rollout import generate_in_segments


class FakeEngine:
    def __init__(self, prompt_len: int) -> None:
        self.version = 0
        self.prompt_len = prompt_len
        self.calls: list[tuple[int, tuple[int, ...], int]] = []  # (n, caps, min_tokens)

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, n: int, caps: Sequence[int]
    ) -> list[list[Completion]]:
        self.calls.append((n, tuple(caps), sampling.min_tokens))
        out = []
        for prompt, cap in zip(prompts, caps):
            target, done = prompt[0], len(prompt) - self.prompt_len
            k = min(cap, target - done)
            stop = done + k >= target
            tokens = (self.version,) * k
            out.append([Completion(tokens, (-self.version - 0.5,) * k, "stop" if stop else "length")] * n)
        return out


def run(
    engine: FakeEngine,
    targets: Sequence[int],
    *,
    max_split: int,
    chunk: int,
    refresh_after: dict[int, int],
    limit: int = 100,
    n: int = 1,
    min_tokens: int = 0,
) -> tuple[list[list[tuple[tuple[int, ...], tuple[TokenSegment, ...], str]]], list[int]]:
    """``refresh_after``: round number -> version the refresh loads then."""
    asked: list[int] = []

    def refresh() -> int | None:
        asked.append(len(engine.calls))
        new = refresh_after.get(len(engine.calls))
        if new is not None:
            engine.version = new
        return new

    prompts = [(t, 1, 2) for t in targets]
    out = generate_in_segments(
        engine.generate,
        prompts,
        [limit] * len(prompts),
        n=n,
        sampling=SamplingConfig(max_tokens=limit, min_tokens=min_tokens),
        config=PartialRollout(max_split=max_split, chunk_tokens=chunk),
        version=0,
        refresh=refresh,
    )
    flat = [
        [(c.completion.token_ids, c.segments, c.completion.finish_reason) for c in per_prompt]
        for per_prompt in out
    ]
    for per_prompt in out:
        for c in per_prompt:  # every token's log-prob is its version's
            assert c.completion.log_probs == tuple(-v - 0.5 for v in c.completion.token_ids)
    return flat, asked


def test_without_refresh_rounds_change_nothing() -> None:
    engine = FakeEngine(prompt_len=3)
    out, asked = run(engine, [3, 10], max_split=3, chunk=4, refresh_after={})
    assert out == [
        [((0,) * 3, (TokenSegment(version=0, num_tokens=3),), "stop")],
        [((0,) * 10, (TokenSegment(version=0, num_tokens=10),), "stop")],
    ]
    # Round 1: both prompts (n per prompt); then only the unfinished one, 4 tokens a round.
    assert [c[1] for c in engine.calls] == [(4, 4), (4,), (4,)]
    assert asked == [1, 2]  # asked after every round that left work open


def test_a_refresh_continues_unfinished_responses_on_new_weights() -> None:
    engine = FakeEngine(prompt_len=3)
    out, _ = run(engine, [3, 10], max_split=3, chunk=4, refresh_after={1: 5})
    short, long = out[0][0], out[1][0]
    assert short == ((0,) * 3, (TokenSegment(version=0, num_tokens=3),), "stop")  # done before the refresh
    assert long[0] == (0,) * 4 + (5,) * 6
    assert long[1] == (TokenSegment(version=0, num_tokens=4), TokenSegment(version=5, num_tokens=6))


def test_max_split_bounds_refreshes_then_decodes_to_the_end() -> None:
    engine = FakeEngine(prompt_len=3)
    out, asked = run(engine, [20], max_split=2, chunk=4, refresh_after={1: 1, 2: 2})
    tokens, segments, finish = out[0][0]
    assert tokens == (0,) * 4 + (1,) * 16 and finish == "stop"
    assert segments == (TokenSegment(version=0, num_tokens=4), TokenSegment(version=1, num_tokens=16))
    # After the one allowed refresh the rest is one call with the whole remaining budget.
    assert engine.calls[-1][1] == (96,) and asked == [1]


def test_n_samples_min_tokens_and_the_length_cap() -> None:
    engine = FakeEngine(prompt_len=3)
    out, _ = run(engine, [50], max_split=4, chunk=4, refresh_after={}, limit=10, n=2, min_tokens=6)
    assert len(out[0]) == 2
    assert all(len(t) == 10 and f == "length" for t, _, f in out[0])
    assert engine.calls[0][0] == 2  # the first round keeps n samples per prompt
    assert [c[2] for c in engine.calls] == [6, 2, 0]  # EOS masked only for what min_tokens has left
    assert engine.calls[-1][1] == (2, 2)  # the last round asks only for what the cap leaves


def test_a_refresh_must_move_forward() -> None:
    engine = FakeEngine(prompt_len=3)
    with pytest.raises(ValueError, match="only load newer"):
        run(engine, [10], max_split=3, chunk=4, refresh_after={1: 0})


def test_partial_rollout_config_is_checked() -> None:
    with pytest.raises(ValueError, match="use 2 or more"):
        PartialRollout(max_split=1, chunk_tokens=4)
    with pytest.raises(ValueError, match="partial_rollout_chunk_tokens"):
        PartialRollout(max_split=2, chunk_tokens=0)
    assert PartialRollout.auto_chunk(32) == 8 and PartialRollout.auto_chunk(3) == 1
