"""A generation actor with multi_turn_enable runs its samples through the agent loop on the real
HF engine and tiny model (which, untrained, makes no well-formed tool calls: the loop's call
handling is tested with a scripted model in tests/mindspeed_rl/tools/test_agent_loop.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model
from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.workers.generation_actor import GenerationActor
from tests.support.plans import CONFIGS, hf_rollout_spec

PROMPTS = {
    "p0": PromptRecord(prompt_id="p0", text="a", token_ids=(5, 6, 7), label=""),
    "p1": PromptRecord(prompt_id="p1", text="b", token_ids=(8, 9), label=""),
}
TOOLS = CONFIGS / "tools" / "retool_config.yaml"


def test_actor_returns_masked_trajectories_within_the_total_budget(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model = create_tiny_model(tmp_path / "model", TINY_TEST_ARCH, seed=0)
    tools = tmp_path / "tools.yaml"
    # The shipped tool YAML with the network opt-out, so the test runs where user namespaces are off.
    tools.write_text(TOOLS.read_text().replace("type: native", "type: native\n      isolate_network: false"))
    spec = hf_rollout_spec(
        model,
        "generate_config.sampling_config.max_tokens=64",
        "++rl_config.multi_turn_enable=true",
        f"++rl_config.tool_config_path={tools}",
        "++rl_config.max_tool_calls=2",
        "++rl_config.max_parallel_calls=1",
        "++rl_config.max_total_response_length=12",
        n=2,
    )
    assert spec.multi_turn is not None
    actor = GenerationActor(spec, str(model), PROMPTS)
    try:
        mb = ScheduledMinibatch(
            minibatch_id=0, prompt_ids=("p0", "p1"), batch_group_id=0, predicted_load=1.0, order_index=0
        )
        done = actor.generate_minibatch(mb)
    finally:
        actor.shutdown()
    assert [(s.prompt_id, s.sample_index) for s in done.samples] == [
        ("p0", 0),
        ("p0", 1),
        ("p1", 0),
        ("p1", 1),
    ]
    for s in done.samples:
        assert 1 <= len(s.response_token_ids) <= 12  # the total budget, not max_tokens (64)
        assert len(s.loss_mask) == len(s.response_token_ids)
        assert s.loss_mask[0] == 1  # a response starts with a model turn
        assert s.tool_use is not None and s.tool_use.turns >= 1
        # Tool-response tokens exist exactly when the trajectory made calls.
        assert (s.tool_use.calls == 0) == (sum(s.loss_mask) == len(s.loss_mask))


def test_tool_metrics_of_a_step() -> None:
    from mindspeed_rl.runtime.records import Sample, ToolUse
    from mindspeed_rl.workers.training_unit import tool_metrics

    def sample(mask: tuple[int, ...], use: ToolUse | None) -> Sample:
        return Sample(
            prompt_id="p", sample_index=0, minibatch_id=0, response_token_ids=(1,) * len(mask),
            rollout_log_probs=(0.0,) * len(mask), reward=None, policy_version=0, gu_id=0, actor_id=0,
            sent_at=0.0, loss_mask=mask, tool_use=use,
        )  # fmt: skip

    samples = [
        sample((1, 1, 0, 0, 1, 1), ToolUse(turns=2, calls=2, errors=1, truncated=1, seconds=0.5)),
        sample((1, 1), ToolUse(turns=1, calls=0, errors=0, truncated=0, seconds=0.0)),
    ]
    assert tool_metrics(samples) == {
        "tools/calls": 2.0,
        "tools/errors": 1.0,
        "tools/calling_fraction": 0.5,
        "tools/ok_call_fraction": 0.5,
        "tools/calls_per_sample": 1.0,
        "tools/turns_per_sample": 1.5,
        "tools/error_fraction": 0.5,
        "tools/truncated_responses": 1.0,
        "tools/seconds": 0.5,
        "tools/response_token_fraction": 0.25,
    }
    assert tool_metrics([sample((1,), None)]) == {}


def test_multi_turn_with_forced_lengths_is_refused(tmp_path: Path) -> None:
    model = create_tiny_model(tmp_path / "model", TINY_TEST_ARCH, seed=0)
    tools = tmp_path / "tools.yaml"
    tools.write_text(TOOLS.read_text().replace("type: native", "type: native\n      isolate_network: false"))
    spec = hf_rollout_spec(
        model,
        "++rl_config.multi_turn_enable=true",
        f"++rl_config.tool_config_path={tools}",
        "++rl_config.max_tool_calls=1",
        "++rl_config.max_parallel_calls=1",
    )
    with pytest.raises(ValueError, match="forced lengths"):
        GenerationActor(spec, str(model), PROMPTS, forced_lengths={"p0": (1, 1), "p1": (1, 1)})
