"""Held-out evaluation of a multi-turn run: each sample is a trajectory of the run's agent loop,
decoded with the evaluation's seeded sampling, scored on the model's own text (tool responses
removed, as in training), with ``eval/tools/*`` metrics.

The turn engine is a scripted stand-in (the untrained tiny model makes no well-formed calls, so a
real engine could not show a call being scored); the agent loop, the hermes parser, the char
tokenizer, the codec and the ``retool_reward`` verifier are the real ones. The actor wiring
(``GenerationActor.decode_held_out`` choosing this path) runs on the real HF engine below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.models.rewards import RewardConfig, build_reward_fn
from mindspeed_rl.models.rollout.base import Completion, SamplingConfig
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, build_char_tokenizer, create_tiny_model
from mindspeed_rl.tools.agent_loop import AgentLoop, AgentSettings, ObservationFormat
from mindspeed_rl.tools.base import ToolResult
from mindspeed_rl.tools.engines import TokenizerCodec
from mindspeed_rl.tools.parsers import get_parser
from mindspeed_rl.workers.evaluator import (
    EvalRequest,
    EvalSettings,
    decode_held_out_with_tools,
    score_held_out,
)
from mindspeed_rl.workers.generation_actor import GenerationActor
from tests.support.plans import CONFIGS, hf_rollout_spec

TOKENIZER = build_char_tokenizer()
CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>'
FORMAT = ObservationFormat(turn_prefix="", response_prefix="<r>", response_suffix="</r>", turn_suffix="")


class ScriptedTurns:
    """Prompt ``a`` calls the tool and then writes ``done`` (the boxed answer only in the tool's
    output); prompt ``b`` answers ``\\boxed{42}`` itself without a call."""

    def __init__(self, seen: list[int | None], sampling: SamplingConfig | None = None) -> None:
        self.seen, self.sampling = seen, sampling

    def with_sampling(self, sampling: SamplingConfig) -> ScriptedTurns:
        return ScriptedTurns(self.seen, sampling)

    def generate_turns(
        self, contexts: Sequence[Sequence[int]], max_tokens: Sequence[int]
    ) -> list[Completion]:
        self.seen.append(None if self.sampling is None else self.sampling.seed)
        out = []
        for context in contexts:
            text = TOKENIZER.decode(list(context), skip_special_tokens=True)
            if text.startswith("a"):
                turn = "done" if "<r>" in text else CALL
            else:
                turn = "\\boxed{42}"
            ids = TOKENIZER.encode(turn, add_special_tokens=False)
            out.append(Completion(tuple(ids), tuple([-0.1] * len(ids)), "stop"))
        return out


class BoxingTool:
    """Answers with the boxed result, so a reward reading tool output would be fooled."""

    name = "python"
    schema: Mapping[str, Any] = {"type": "function", "function": {"name": "python", "parameters": {}}}

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        return ToolResult("\\boxed{42}")


def _prompt(pid: str, text: str) -> PromptRecord:
    return PromptRecord(
        prompt_id=pid,
        text=text,
        token_ids=tuple(TOKENIZER.encode(text, add_special_tokens=False)),
        label="42",
    )


def test_held_out_trajectories_are_scored_on_the_models_own_text() -> None:
    seen: list[int | None] = []
    loop = AgentLoop(
        engine=ScriptedTurns(seen),
        parser=get_parser("hermes"),
        tools={"python": BoxingTool()},
        codec=TokenizerCodec(TOKENIZER),
        settings=AgentSettings(
            max_tool_calls=2, max_parallel_calls=1, max_total_response_length=400, max_tool_response_length=0
        ),
        observation=FORMAT,
    )
    prompts = (_prompt("v0", "a: 6*7="), _prompt("v1", "b: 6*7="))
    settings = EvalSettings(
        sampling=SamplingConfig(max_tokens=200, temperature=1.0),
        num_samples_per_prompt=2,
        seed=11,
        max_response_tokens=400,
    )
    job = EvalRequest(prompts=prompts, settings=settings).job(0, 0)
    assert job.max_new_tokens == 2 * 2 * 400  # the hang bound covers every turn of a trajectory
    try:
        decoded = decode_held_out_with_tools(loop, ScriptedTurns(seen), job, weights_version=5)
    finally:
        loop.close()
    assert seen and set(seen) == {11}  # every turn decoded with the evaluation's seed
    assert [u.calls for u in decoded.tool_use] == [1, 1, 0, 0]
    assert all(len(m) == len(r) for m, r in zip(decoded.loss_masks, decoded.responses, strict=True))
    assert 0 in decoded.loss_masks[0] and 0 not in decoded.loss_masks[2]
    reward = build_reward_fn(RewardConfig(verifier_function=("retool_reward",), verifier_weight=(1.0,)))
    metrics = score_held_out(decoded, prompts, TOKENIZER, reward)
    # "a" got its boxed answer from the tool only: -1 + 0.1 for its tool round; "b" boxed it itself.
    assert metrics["eval/reward_mean"] == pytest.approx((-0.9 - 0.9 + 1 + 1) / 4)
    assert metrics["eval/accuracy"] == 0.5
    assert metrics["eval/tools/calls_per_sample"] == 0.5
    assert metrics["eval/tools/calling_fraction"] == 0.5
    assert metrics["eval/tools/ok_call_fraction"] == 1.0
    assert metrics["eval/tools/turns_per_sample"] == 1.5


def test_a_multi_turn_actor_evaluates_with_its_tools(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model = create_tiny_model(tmp_path / "model", TINY_TEST_ARCH, seed=0)
    tools = tmp_path / "tools.yaml"
    retool = (CONFIGS / "tools" / "retool_config.yaml").read_text()
    tools.write_text(retool.replace("type: native", "type: native\n      isolate_network: false"))
    spec = hf_rollout_spec(
        model,
        "generate_config.sampling_config.max_tokens=8",
        "++rl_config.multi_turn_enable=true",
        f"++rl_config.tool_config_path={tools}",
        "++rl_config.max_tool_calls=1",
        "++rl_config.max_parallel_calls=1",
        "++rl_config.max_total_response_length=16",
    )
    prompts = (_prompt("v0", "a*3="), _prompt("v1", "b*3="))
    actor = GenerationActor(spec, str(model), {p.prompt_id: p for p in prompts})
    try:
        settings = EvalSettings(sampling=SamplingConfig(max_tokens=8), num_samples_per_prompt=2, seed=3)
        decoded = actor.decode_held_out(EvalRequest(prompts=prompts, settings=settings).job(0, 0))
    finally:
        actor.shutdown()
    # Trajectories of the agent loop: a mask and a tool record per sample, within the total budget.
    assert len(decoded.responses) == len(decoded.loss_masks) == len(decoded.tool_use) == 4
    for response, mask, use in zip(decoded.responses, decoded.loss_masks, decoded.tool_use, strict=True):
        assert 1 <= len(response) <= 16 and len(mask) == len(response) and use.turns >= 1
