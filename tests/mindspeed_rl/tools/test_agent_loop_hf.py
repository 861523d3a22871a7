"""The agent loop on the real HF engine and tiny model: turns continue from prompt + earlier turns
+ tool responses, and every model token's rollout log-prob is the log-prob a plain forward of the
whole trajectory gives it (what the trainer recomputes), tool tokens included in the context.

The untrained model writes no well-formed call, so a stand-in parser declares a call in every turn
(max_tool_calls=2 then gives three model turns around two tool responses)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from mindspeed_rl.models.rollout.base import SamplingConfig
from mindspeed_rl.models.rollout.hf_engine import HFEngine
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model
from mindspeed_rl.tools.agent_loop import AgentLoop, AgentSettings, ObservationFormat
from mindspeed_rl.tools.base import ToolResult
from mindspeed_rl.tools.engines import EngineTurns
from mindspeed_rl.tools.parsers import ParsedCall, ToolCall


class EveryTurnCalls:
    close_marker = "</tool_call>"

    def parse(self, text: str) -> list[ParsedCall]:
        return [ToolCall("echo", {})]


class SmallCodec:
    """Characters onto token ids 3..102 of the tiny vocabulary."""

    def encode(self, text: str) -> list[int]:
        return [3 + ord(c) % 100 for c in text]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(t) for t in token_ids)


class Echo:
    name = "echo"
    schema: Mapping[str, Any] = {"type": "function", "function": {"name": "echo"}}

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        return ToolResult("tool says hi")


def test_turn_log_probs_equal_a_forward_of_the_whole_trajectory(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model_dir = create_tiny_model(tmp_path / "model", TINY_TEST_ARCH, seed=0)
    engine = HFEngine(str(model_dir), seed=0)
    loop = AgentLoop(
        engine=EngineTurns(engine, SamplingConfig(max_tokens=12, temperature=1.0, ignore_eos=True), []),
        parser=EveryTurnCalls(),
        tools={"echo": Echo()},
        codec=SmallCodec(),
        settings=AgentSettings(
            max_tool_calls=2, max_parallel_calls=1, max_total_response_length=200, max_tool_response_length=0
        ),
        observation=ObservationFormat(
            turn_prefix="", response_prefix="[", response_suffix="]", turn_suffix=""
        ),
        tool_workers=2,
    )
    prompts = [[2, 80, 81, 82], [2, 50]]
    results = loop.run(prompts)
    loop.close()
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    observation = SmallCodec().encode("[tool says hi]")
    for prompt, result in zip(prompts, results):
        c = result.completion
        assert c.loss_mask is not None
        assert result.stats.turns == 3 and result.stats.tool_calls == 2
        assert len(c.loss_mask) - sum(c.loss_mask) == 2 * len(observation)
        assert sum(c.loss_mask) == 3 * 12  # sampling max_tokens caps each of the three turns
        sequence = torch.tensor([prompt + list(c.token_ids)])
        with torch.no_grad():
            logp = torch.log_softmax(reference(input_ids=sequence).logits[0].float(), dim=-1)
        for j, (token, lp, keep) in enumerate(zip(c.token_ids, c.log_probs, c.loss_mask)):
            if keep:
                assert abs(float(logp[len(prompt) - 1 + j, token]) - lp) < 1e-4, j
            else:
                assert lp == 0.0
