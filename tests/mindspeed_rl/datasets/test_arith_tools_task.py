"""builtin:arith_tools, the tool-use demo task: prompts, warm-up trajectories, reward."""

from __future__ import annotations

import pytest

from mindspeed_rl.datasets.arith_tools_task import (
    answer_for,
    arith_tools_reward,
    arith_tools_sft_pairs,
    generate_arith_tools_prompts,
    tool_call_text,
    tool_trajectory,
    trajectory_tokens,
)
from mindspeed_rl.tools.agent_loop import ObservationFormat
from mindspeed_rl.tools.parsers import ToolCall, get_parser
from mindspeed_rl.tools.retool import ReTool
from mindspeed_rl.tools.sandbox import SandboxLimits, run_python_locally


def test_prompts_multiply_two_and_three_digit_numbers() -> None:
    rows = generate_arith_tools_prompts(200, seed=3)
    assert rows == generate_arith_tools_prompts(200, seed=3)
    for row in rows:
        a, b = row["prompt"].rstrip("=").split("*")
        assert 2 <= len(a) <= 3 and 2 <= len(b) <= 3
        assert int(row["answer"]) == int(a) * int(b) and len(row["answer"]) == 6
    assert {len(r["prompt"]) for r in rows} == {6, 7, 8}
    with pytest.raises(ValueError, match="expected '<a>\\*<b>='"):
        answer_for("k*5=")


def test_the_warm_up_trajectory_is_what_the_agent_loop_and_retool_produce() -> None:
    prompt = "37*482="
    call = get_parser("hermes").parse(tool_call_text(prompt))
    assert call == [ToolCall(name="python", arguments={"code": "'%06d'%(37*482)"})]
    assert isinstance(call[0], ToolCall)
    code = ReTool({"isolate_network": False}, {"function": {"name": "python"}}).prepare(
        call[0].arguments["code"]
    )
    printed = run_python_locally(
        code, SandboxLimits(timeout_s=10, memory_limit_mb=512, isolate_network=False)
    )
    fmt = ObservationFormat()
    observation = (
        fmt.turn_prefix + fmt.response_prefix + printed.stdout + fmt.response_suffix + fmt.turn_suffix
    )
    assert tool_trajectory(prompt) == tool_call_text(prompt) + observation + "017834"
    # Character tokens, each <|...|> one token, plus eos.
    assert trajectory_tokens(prompt) == len(tool_trajectory(prompt)) - 2 * 11 - 9 + 1


def test_warm_up_mixes_tool_trajectories_and_direct_answers() -> None:
    pairs = arith_tools_sft_pairs(400, seed=0)
    with_tool = [t for _, t in pairs if t.startswith("<tool_call>")]
    assert 0.8 < len(with_tool) / len(pairs) < 0.97
    assert all(t == answer_for(p) for p, t in pairs if not t.startswith("<tool_call>"))
    assert pairs != arith_tools_sft_pairs(400, seed=1)
    assert all(t.startswith("<tool_call>") for _, t in arith_tools_sft_pairs(20, seed=0, tool_fraction=1.0))


@pytest.mark.parametrize(
    ("model_text", "reward"),
    [
        ('<tool_call>{"name":"python"}</tool_call>017834<|endoftext|>', 1.0),
        ("17834", 1.0),  # leading zeros optional
        ("017835", 0.0),
        ('<tool_call>{"name":"python"}</tool_call>', 0.0),  # cut after the call: no answer
        ("017834 and more", 0.0),
        ("", 0.0),
    ],
)
def test_reward_reads_the_final_answer_after_the_last_call(model_text: str, reward: float) -> None:
    assert arith_tools_reward(model_text, "017834", 1) == reward


def test_the_tool_response_earns_nothing_through_the_reward_function() -> None:
    from mindspeed_rl.models.rewards.config import RewardConfig
    from mindspeed_rl.models.rewards.registry import build_reward_fn
    from mindspeed_rl.models.rewards.retool import ToolRecord

    fn = build_reward_fn(RewardConfig(verifier_function=["arith_tools"], verifier_weight=[1.0]))
    full = tool_trajectory("37*482=")
    call = tool_call_text("37*482=")
    # The model stopped after the tool answered: the product is only in the tool's text.
    result = fn([full[: -len("017834")]], ["017834"], [ToolRecord(model_text=call, tool_rounds=1)])
    assert result.rewards.tolist() == [0.0]
    result = fn([full], ["017834"], [ToolRecord(model_text=call + "017834", tool_rounds=1)])
    assert result.rewards.tolist() == [1.0]
