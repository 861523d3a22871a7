"""The agent loop against a scripted stand-in model (pure logic: no engine is needed to check the
loop's rules; the HF engine test drives it with a real model)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from mindspeed_rl.models.rollout.base import Completion
from mindspeed_rl.tools.agent_loop import AgentLoop, AgentSettings, ObservationFormat, truncate_tokens
from mindspeed_rl.tools.base import ToolResult
from mindspeed_rl.tools.parsers import get_parser

FORMAT = ObservationFormat(turn_prefix="", response_prefix="<r>", response_suffix="</r>", turn_suffix="")


class CharCodec:
    """One token per character: token counts are character counts."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(t) for t in token_ids)


def call(name: str, **arguments: Any) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class ScriptedModel:
    """Turn k of the trajectory whose prompt is ``P`` is ``script(P, k, context_text)``."""

    def __init__(self, script: Callable[[str, int, str], str]) -> None:
        self.script = script
        self.turns: dict[str, int] = {}
        self.batches: list[list[str]] = []

    def generate_turns(
        self, contexts: Sequence[Sequence[int]], max_tokens: Sequence[int]
    ) -> list[Completion]:
        out = []
        self.batches.append([])
        for context, cap in zip(contexts, max_tokens):
            text = CharCodec().decode(context)
            prompt = text.split("|", 1)[0]
            k = self.turns.get(prompt, 0)
            self.turns[prompt] = k + 1
            self.batches[-1].append(prompt)
            ids = CharCodec().encode(self.script(prompt, k, text))
            cut = ids[:cap]
            out.append(
                Completion(tuple(cut), tuple([-0.5] * len(cut)), "stop" if len(cut) == len(ids) else "length")
            )
        return out


class FnTool:
    def __init__(self, name: str, fn: Callable[[Mapping[str, Any]], str]) -> None:
        self._name, self._fn = name, fn

    @property
    def name(self) -> str:
        return self._name

    @property
    def schema(self) -> Mapping[str, Any]:
        return {"type": "function", "function": {"name": self._name, "parameters": {}}}

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        return ToolResult(self._fn(arguments))


def make_loop(model: ScriptedModel, tools: Sequence[FnTool], **settings: Any) -> AgentLoop:
    base: dict[str, Any] = dict(
        max_tool_calls=4, max_parallel_calls=2, max_total_response_length=1000, max_tool_response_length=0
    )
    base.update(settings)
    return AgentLoop(
        engine=model,
        parser=get_parser("hermes"),
        tools={t.name: t for t in tools},
        codec=CharCodec(),
        settings=AgentSettings(**base),
        observation=FORMAT,
        tool_workers=8,
    )


def prompt(name: str) -> list[int]:
    return CharCodec().encode(name + "|")


def text(completion: Completion) -> str:
    return CharCodec().decode(completion.token_ids)


def test_call_then_answer_masks_exactly_the_tool_response() -> None:
    model = ScriptedModel(lambda p, k, ctx: call("echo", v="hi") if k == 0 else "done")
    loop = make_loop(model, [FnTool("echo", lambda a: f"got {a['v']}")])
    (result,) = loop.run([prompt("A")])
    c = result.completion
    assert text(c) == call("echo", v="hi") + "<r>got hi</r>" + "done"
    observation = len("<r>got hi</r>")
    first = len(call("echo", v="hi"))
    assert c.loss_mask == (1,) * first + (0,) * observation + (1,) * len("done")
    assert c.log_probs[first : first + observation] == (0.0,) * observation
    assert c.finish_reason == "stop"
    assert result.stats.turns == 2 and result.stats.tool_calls == 1 and result.stats.tool_errors == 0
    assert result.stats.tool_tokens == observation


def test_max_tool_calls_ends_the_trajectory() -> None:
    model = ScriptedModel(lambda p, k, ctx: call("echo", v=str(k)))  # always calls
    executed: list[str] = []
    loop = make_loop(model, [FnTool("echo", lambda a: executed.append(a["v"]) or "ok")], max_tool_calls=2)
    (result,) = loop.run([prompt("A")])
    assert executed == ["0", "1"]
    assert result.stats.turns == 3 and result.completion.finish_reason == "stop"
    assert text(result.completion).endswith(call("echo", v="2"))  # the third call was not answered


def test_parallel_calls_run_together_and_extra_calls_are_refused() -> None:
    both_running = threading.Barrier(2, timeout=10)  # passes only if two calls run at once

    def meet(a: Mapping[str, Any]) -> str:
        both_running.wait()
        return f"met {a['v']}"

    three = call("meet", v="1") + call("meet", v="2") + call("meet", v="3")
    model = ScriptedModel(lambda p, k, ctx: three if k == 0 else "end")
    loop = make_loop(model, [FnTool("meet", meet)], max_parallel_calls=2)
    (result,) = loop.run([prompt("A")])
    out = text(result.completion)
    assert "<r>met 1</r><r>met 2</r><r>Error: call not run: at most 2 call(s) per turn" in out
    assert result.stats.tool_calls == 3 and result.stats.tool_errors == 1


def test_a_slow_tool_does_not_hold_back_other_trajectories() -> None:
    """A waits on a tool that is released only when B has taken its third turn: with a barrier per
    turn B could never get there and A's tool would run out its wait."""
    released = threading.Event()
    outcome: list[bool] = []

    def slow(a: Mapping[str, Any]) -> str:
        outcome.append(released.wait(timeout=20))
        return "slow done"

    def script(p: str, k: int, ctx: str) -> str:
        if p == "A":
            return call("slow") if k == 0 else "A end"
        if k == 2:
            released.set()
            return "B end"
        return call("fast")

    model = ScriptedModel(script)
    loop = make_loop(model, [FnTool("slow", slow), FnTool("fast", lambda a: "quick")])
    a, b = loop.run([prompt("A"), prompt("B")])
    assert outcome == [True]
    assert text(a.completion).endswith("<r>slow done</r>A end")
    assert b.stats.turns == 3
    # B's second and third turns were decoded alone, while A waited on its tool.
    assert model.batches[0] == ["A", "B"] and ["B"] in model.batches[1:3]


@pytest.mark.parametrize(
    ("side", "expected"), [("left", "456789"), ("right", "012345"), ("middle", "012789")]
)
def test_tool_response_is_truncated_on_the_configured_side(side: str, expected: str) -> None:
    model = ScriptedModel(lambda p, k, ctx: call("digits") if k == 0 else "x")
    loop = make_loop(
        model, [FnTool("digits", lambda a: "0123456789")], max_tool_response_length=6, truncate_side=side
    )
    (result,) = loop.run([prompt("A")])
    assert f"<r>{expected}</r>" in text(result.completion)
    assert result.stats.truncated_responses == 1


def test_total_budget_counts_tool_tokens_and_ends_with_length() -> None:
    model = ScriptedModel(lambda p, k, ctx: call("big"))
    first = len(call("big"))
    budget = first + 20
    loop = make_loop(model, [FnTool("big", lambda a: "z" * 100)], max_total_response_length=budget)
    (result,) = loop.run([prompt("A")])
    c = result.completion
    assert len(c.token_ids) == budget and c.finish_reason == "length"
    assert c.loss_mask == (1,) * first + (0,) * 20


def test_model_turn_cut_by_the_budget_ends_with_length() -> None:
    model = ScriptedModel(lambda p, k, ctx: "y" * 50)
    loop = make_loop(model, [], max_total_response_length=30)
    (result,) = loop.run([prompt("A")])
    assert len(result.completion.token_ids) == 30 and result.completion.finish_reason == "length"


def test_bad_calls_become_error_responses() -> None:
    def boom(a: Mapping[str, Any]) -> str:
        raise RuntimeError("kaput")

    turn = "<tool_call>{oops}</tool_call>" + call("nope") + call("boom")
    model = ScriptedModel(lambda p, k, ctx: turn if k == 0 else "ok")
    loop = make_loop(model, [FnTool("boom", boom)], max_parallel_calls=3)
    (result,) = loop.run([prompt("A")])
    out = text(result.completion)
    assert "<r>Error: tool call is not valid JSON" in out
    assert "<r>Error: unknown tool 'nope'; available tools: ['boom']</r>" in out
    assert "<r>Error: tool 'boom' failed: RuntimeError: kaput</r>" in out
    assert result.stats.tool_errors == 3 and out.endswith("ok")


def test_truncate_tokens_keeps_short_input() -> None:
    assert truncate_tokens([1, 2, 3], 5, "middle") == [1, 2, 3]
    assert truncate_tokens([1, 2, 3], 0, "left") == [1, 2, 3]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_parallel_calls=0"):
        AgentSettings(
            max_tool_calls=1, max_parallel_calls=0, max_total_response_length=10, max_tool_response_length=0
        )
    with pytest.raises(ValueError, match="tool_response_truncate_side"):
        AgentSettings(
            max_tool_calls=1,
            max_parallel_calls=1,
            max_total_response_length=10,
            max_tool_response_length=0,
            truncate_side="top",  # type: ignore[arg-type]
        )


def test_a_last_turn_cut_by_its_own_cap_ends_with_length() -> None:
    class CappedTurns(ScriptedModel):
        def generate_turns(
            self, contexts: Sequence[Sequence[int]], max_tokens: Sequence[int]
        ) -> list[Completion]:
            return super().generate_turns(contexts, [min(cap, 5) for cap in max_tokens])  # a 5-token turn cap

    loop = make_loop(CappedTurns(lambda p, k, ctx: "a long answer"), [], max_total_response_length=100)
    (result,) = loop.run([prompt("A")])
    assert text(result.completion) == "a lon" and result.completion.finish_reason == "length"


def test_a_hung_tool_is_answered_with_a_timeout_and_its_trajectory_goes_on() -> None:
    release = threading.Event()

    def script(p: str, k: int, context: str) -> str:
        if k == 0:
            return call("hang" if p == "slow" else "echo", x=p)
        return "done" if "timed out" in context or "<r>" in context else "?"

    model = ScriptedModel(script)
    tools = [FnTool("hang", lambda a: str(release.wait())), FnTool("echo", lambda a: str(a["x"]))]
    loop = make_loop(model, tools, call_timeout_s=0.3)
    try:
        slow, fast = loop.run([prompt("slow"), prompt("fast")])
    finally:
        release.set()
        loop.close()
    assert "Error: tool call timed out after 0.3 s" in text(slow.completion)
    assert text(slow.completion).endswith("done") and slow.stats.tool_errors == 1
    assert slow.stats.tool_seconds >= 0.3
    # The other trajectory was not held back by the hung call: it finished in an earlier batch.
    assert text(fast.completion).endswith("done") and fast.stats.tool_errors == 0
    assert model.batches[1] == ["fast"]


def test_the_call_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="tool_call_timeout=0"):
        AgentSettings(max_tool_calls=1, max_parallel_calls=1, max_total_response_length=10,
                      max_tool_response_length=0, call_timeout_s=0)  # fmt: skip
