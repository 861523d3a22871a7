"""The agent loop: multi-turn rollouts in which the model calls tools, engine-independent.

Each trajectory is a small state machine, *decoding* or *waiting on its tools*:

1. every decoding trajectory gets one turn from the engine, batched with the others, which ends
   at EOS, right after a tool call closes (the parser's ``close_marker``), or at the budget;
2. the turn's text is parsed; no call -> the trajectory is finished. Calls (at most
   ``max_parallel_calls`` of them per turn, and ``max_tool_calls`` per trajectory) go to a
   thread pool, and the trajectory waits;
3. when all of a trajectory's calls have answered, their responses (each cut to
   ``max_tool_response_length`` tokens on ``truncate_side``) are appended and it decodes again,
   in whichever engine batch comes next.

There is no barrier per turn: a trajectory whose tool is slow does not hold back the others,
which keep taking turns; the loop blocks on tools only when nothing is left to decode.

Tool-response tokens carry log-prob 0 and loss mask 0: they stay in the context the trainer
recomputes log-probs on, but are not the policy's actions (``Completion.loss_mask``).
Nothing the model writes can crash the loop: malformed calls, unknown tools, bad arguments and
tools that raise are answered with an error text the model sees; so is a call still unanswered
``call_timeout_s`` after its submission (a hung custom tool): its trajectory goes on, and the
thread it holds is abandoned (Python cannot stop a thread; a tool that can hang for good should
bound itself, as the code tool's sandbox does).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Literal, Protocol

from mindspeed_rl.models.rollout.base import Completion
from mindspeed_rl.tools.base import Tool, ToolResult
from mindspeed_rl.tools.parsers import CallError, ParsedCall, ToolParser

TruncateSide = Literal["left", "right", "middle"]
TRUNCATE_SIDES: tuple[TruncateSide, ...] = ("left", "right", "middle")


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSettings:
    """``rl_config``'s multi-turn keys, checked."""

    max_tool_calls: int
    """Tool calls one trajectory may make; a turn that calls beyond it ends the trajectory."""
    max_parallel_calls: int
    """Calls of one turn run together; further calls in the same turn are answered with an error."""
    max_total_response_length: int
    """Tokens of the whole response: model turns and tool responses together."""
    max_tool_response_length: int
    """Tokens of one tool response after truncation; 0 = no cap but the total budget."""
    truncate_side: TruncateSide = "middle"
    """Which part of a long tool response is cut: left keeps its end, right its start, middle both."""
    call_timeout_s: float = 120.0
    """Seconds from a call's submission until it is answered with a timeout error (a hung tool
    must not hold its trajectory, and the loop's minibatch, forever)."""

    def __post_init__(self) -> None:
        problems = [
            (self.max_tool_calls >= 1, f"max_tool_calls={self.max_tool_calls} must be >= 1"),
            (self.max_parallel_calls >= 1, f"max_parallel_calls={self.max_parallel_calls} must be >= 1"),
            (
                self.max_total_response_length >= 1,
                f"max_total_response_length={self.max_total_response_length} must be >= 1",
            ),
            (
                self.max_tool_response_length >= 0,
                f"max_tool_response_length={self.max_tool_response_length} must be >= 0",
            ),
            (self.call_timeout_s > 0, f"tool_call_timeout={self.call_timeout_s} must be > 0 seconds"),
            (
                self.truncate_side in TRUNCATE_SIDES,
                f"tool_response_truncate_side={self.truncate_side!r} must be one of {TRUNCATE_SIDES}",
            ),
        ]
        for ok, message in problems:
            if not ok:
                raise ValueError(f"rl_config.{message} (multi_turn_enable)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservationFormat:
    """Text around tool responses. The default is Qwen2.5's chat template for a tool turn (the
    assistant turn was closed by its EOS ``<|im_end|>``); models with another template set theirs."""

    turn_prefix: str = "\n<|im_start|>user"
    response_prefix: str = "\n<tool_response>\n"
    response_suffix: str = "\n</tool_response>"
    turn_suffix: str = "<|im_end|>\n<|im_start|>assistant\n"


class TurnEngine(Protocol):
    """One turn for each context, ending at EOS, right after a stop sequence, or at its cap."""

    def generate_turns(
        self, contexts: Sequence[Sequence[int]], max_tokens: Sequence[int]
    ) -> list[Completion]: ...


class TextCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TrajectoryStats:
    turns: int
    tool_calls: int
    """Calls that were answered (well-formed or not), refused ones included."""
    tool_errors: int
    """Answers with ok=False: malformed calls, unknown tools, bad arguments, failures, refusals."""
    truncated_responses: int
    tool_seconds: float
    """Wall-clock seconds of this trajectory's tool calls, summed over calls."""
    tool_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentResult:
    completion: Completion
    stats: TrajectoryStats


@dataclass(slots=True)
class _Trajectory:
    prompt: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: int = 0
    calls: int = 0
    errors: int = 0
    truncated: int = 0
    tool_seconds: float = 0.0
    finish: str | None = None

    @property
    def context(self) -> list[int]:
        return [*self.prompt, *self.tokens]


@dataclass(slots=True)
class _Waiting:
    """A trajectory's calls of one turn; responses land in order as they finish."""

    trajectory: _Trajectory
    responses: list[ToolResult | None]
    seconds: list[float]


def truncate_tokens(ids: list[int], limit: int, side: TruncateSide) -> list[int]:
    if limit <= 0 or len(ids) <= limit:
        return ids
    if side == "left":
        return ids[len(ids) - limit :]
    if side == "right":
        return ids[:limit]
    head = limit - limit // 2
    return ids[:head] + ids[len(ids) - (limit - head) :]


class AgentLoop:
    """Runs trajectories for a batch of prompts; reusable across batches (the pool is kept)."""

    def __init__(
        self,
        *,
        engine: TurnEngine,
        parser: ToolParser,
        tools: Mapping[str, Tool],
        codec: TextCodec,
        settings: AgentSettings,
        observation: ObservationFormat | None = None,
        tool_workers: int = 16,
    ) -> None:
        if tool_workers < 1:
            raise ValueError(f"tool_workers={tool_workers} must be >= 1")
        self._engine = engine
        self._parser = parser
        self._tools = dict(tools)
        self._codec = codec
        self._settings = settings
        self._format = observation or ObservationFormat()
        self._pool = ThreadPoolExecutor(max_workers=tool_workers, thread_name_prefix="tool-call")
        self._submitted: dict[Future[tuple[ToolResult, float]], float] = {}

    def close(self) -> None:
        # Not waiting: a hung tool's thread (answered by its timeout) would block shutdown forever.
        self._pool.shutdown(wait=False, cancel_futures=True)

    def run(self, prompts: Sequence[Sequence[int]], *, engine: TurnEngine | None = None) -> list[AgentResult]:
        """One trajectory per prompt (repeat a prompt for several samples), in prompt order.
        ``engine``: decode this call's turns on it instead (held-out evaluation: the same engine
        with the evaluation's seeded sampling), with the same tools, parser and limits."""
        turn_engine = self._engine if engine is None else engine
        trajectories = [_Trajectory(prompt=tuple(p)) for p in prompts]
        decoding = list(trajectories)
        pending: dict[Future[tuple[ToolResult, float]], tuple[_Waiting, int]] = {}
        limit = self._settings.call_timeout_s
        while decoding or pending:
            if decoding:
                self._take_turns(turn_engine, decoding, pending)
                decoding = []
            if pending:
                # Block only while nothing can decode (and no longer than the first call's deadline);
                # then take every answer that is in, and answer every call past its deadline.
                first_deadline = min(self._submitted[f] for f in pending) + limit
                done, _ = wait(
                    list(pending),
                    timeout=max(0.0, first_deadline - time.monotonic()),
                    return_when=FIRST_COMPLETED,
                )
                now = time.monotonic()
                answers = {f: f.result() for f in done}
                for future in pending.keys() - done:
                    if now - self._submitted[future] >= limit:
                        # The thread cannot be stopped; its late answer is dropped (cancel is a no-op
                        # for a running call, and frees the worker of one still queued).
                        future.cancel()
                        text = f"Error: tool call timed out after {limit:g} s (rl_config.tool_call_timeout)"
                        answers[future] = (ToolResult(text, ok=False), now - self._submitted[future])
                for future, answer in answers.items():
                    waiting, index = pending.pop(future)
                    del self._submitted[future]
                    waiting.responses[index], waiting.seconds[index] = answer
                    answered = all(r is not None for r in waiting.responses)
                    if answered and self._append_responses(waiting):
                        decoding.append(waiting.trajectory)
        return [self._result(t) for t in trajectories]

    def _take_turns(
        self,
        engine: TurnEngine,
        decoding: list[_Trajectory],
        pending: dict[Future[tuple[ToolResult, float]], tuple[_Waiting, int]],
    ) -> None:
        budget = self._settings.max_total_response_length
        caps = [budget - len(t.tokens) for t in decoding]
        turns = engine.generate_turns([t.context for t in decoding], caps)
        for trajectory, turn in zip(decoding, turns):
            trajectory.turns += 1
            trajectory.tokens.extend(turn.token_ids)
            trajectory.log_probs.extend(turn.log_probs)
            trajectory.mask.extend([1] * len(turn.token_ids))
            calls = self._parser.parse(self._codec.decode(turn.token_ids))
            left = self._settings.max_tool_calls - trajectory.calls
            if not calls or left <= 0 or len(trajectory.tokens) >= budget:
                # "length": cut by the budget, or a last turn that hit its own cap mid-answer.
                cut = len(trajectory.tokens) >= budget or (not calls and turn.finish_reason == "length")
                trajectory.finish = "length" if cut else "stop"
                continue
            # At least one call runs (left >= 1), so every waiting trajectory has a future pending.
            waiting = _Waiting(
                trajectory=trajectory, responses=[None] * len(calls), seconds=[0.0] * len(calls)
            )
            for index, future in enumerate(self._submit(waiting, calls)):
                if future is not None:
                    pending[future] = (waiting, index)

    def _submit(
        self, waiting: _Waiting, calls: list[ParsedCall]
    ) -> list[Future[tuple[ToolResult, float]] | None]:
        settings = self._settings
        allowed = min(settings.max_parallel_calls, settings.max_tool_calls - waiting.trajectory.calls)
        futures: list[Future[tuple[ToolResult, float]] | None] = []
        for index, call in enumerate(calls):
            if index >= allowed:
                waiting.responses[index] = ToolResult(
                    f"Error: call not run: at most {settings.max_parallel_calls} call(s) per turn and "
                    f"{settings.max_tool_calls} per response",
                    ok=False,
                )
                futures.append(None)
            else:
                future = self._pool.submit(self._call, call)
                self._submitted[future] = time.monotonic()
                futures.append(future)
        waiting.trajectory.calls += len(calls)
        return futures

    def _call(self, call: ParsedCall) -> tuple[ToolResult, float]:
        started = time.monotonic()
        if isinstance(call, CallError):
            return ToolResult(f"Error: {call.message}", ok=False), 0.0
        tool = self._tools.get(call.name)
        if tool is None:
            result = ToolResult(
                f"Error: unknown tool {call.name!r}; available tools: {sorted(self._tools)}", ok=False
            )
            return result, 0.0
        try:
            result = tool.execute(call.arguments)
        except Exception as exc:  # a tool bug must not end the rollout; the model sees it
            result = ToolResult(f"Error: tool {call.name!r} failed: {type(exc).__name__}: {exc}", ok=False)
        return result, time.monotonic() - started

    def _append_responses(self, waiting: _Waiting) -> bool:
        """Append the turn's answers; True when the trajectory has budget left to decode."""
        trajectory, fmt, settings = waiting.trajectory, self._format, self._settings
        encode = self._codec.encode
        ids = encode(fmt.turn_prefix)
        for response in waiting.responses:
            assert response is not None
            body = encode(response.text)
            cut = truncate_tokens(body, settings.max_tool_response_length, settings.truncate_side)
            trajectory.truncated += len(cut) < len(body)
            trajectory.errors += not response.ok
            ids += encode(fmt.response_prefix) + cut + encode(fmt.response_suffix)
        ids += encode(fmt.turn_suffix)
        trajectory.tool_seconds += sum(waiting.seconds)
        room = settings.max_total_response_length - len(trajectory.tokens)
        ids = ids[:room]
        trajectory.tokens.extend(ids)
        trajectory.log_probs.extend([0.0] * len(ids))
        trajectory.mask.extend([0] * len(ids))
        if len(trajectory.tokens) >= settings.max_total_response_length:
            trajectory.finish = "length"
            return False
        return True

    def _result(self, t: _Trajectory) -> AgentResult:
        assert t.finish is not None, "every trajectory ends with a finish reason"
        completion = Completion(tuple(t.tokens), tuple(t.log_probs), t.finish, loss_mask=tuple(t.mask))
        stats = TrajectoryStats(
            turns=t.turns,
            tool_calls=t.calls,
            tool_errors=t.errors,
            truncated_responses=t.truncated,
            tool_seconds=t.tool_seconds,
            tool_tokens=len(t.mask) - sum(t.mask),
        )
        return AgentResult(completion=completion, stats=stats)
