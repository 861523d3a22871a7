"""The trajectory cost ASP balances multi-turn work by (tools/trajectory_cost.py, trainer/online_asp.py)."""

from __future__ import annotations

import pytest

from mindspeed_rl.runtime.records import CompletedMinibatch, Sample, ToolUse
from mindspeed_rl.tools.trajectory_cost import DecodeRate, TrajectoryWork, trajectory_cost


def test_cost_is_tokens_plus_tool_seconds_at_the_decode_rate() -> None:
    work = TrajectoryWork(response_tokens=120, model_tokens=80, tool_seconds=2.0)
    assert trajectory_cost(work, 50.0) == pytest.approx(220.0)
    assert trajectory_cost(work, None) == 120.0  # rate not measured yet: tokens only
    with pytest.raises(ValueError, match="non-negative"):
        trajectory_cost(TrajectoryWork(response_tokens=1, model_tokens=1, tool_seconds=-1.0), 1.0)


def test_decode_rate_is_the_trajectory_that_ended_the_minibatch() -> None:
    rate = DecodeRate()
    works = [
        TrajectoryWork(response_tokens=100, model_tokens=100, tool_seconds=0.0),  # >= 100/10 = 10 tok/s
        TrajectoryWork(response_tokens=90, model_tokens=60, tool_seconds=6.0),  # >= 60/4 = 15 tok/s
    ]
    assert rate.observe(works, 10.0) == pytest.approx(15.0)
    # Later minibatches are smoothed in, not taken as they are.
    second = rate.observe([TrajectoryWork(response_tokens=10, model_tokens=50, tool_seconds=0.0)], 1.0)
    assert second is not None and 15.0 < second < 50.0
    # A minibatch that says nothing about decoding (all tool time) leaves the rate alone.
    assert rate.observe([TrajectoryWork(response_tokens=5, model_tokens=5, tool_seconds=3.0)], 3.0) == second


def _sample(prompt: str, tokens: int, mask: tuple[int, ...], use: ToolUse | None) -> Sample:
    return Sample(
        prompt_id=prompt, sample_index=0, minibatch_id=0, response_token_ids=(1,) * tokens,
        rollout_log_probs=(0.0,) * tokens, reward=None, policy_version=0, gu_id=0, actor_id=0,
        sent_at=0.0, loss_mask=mask, tool_use=use,
    )  # fmt: skip


def test_online_asp_learns_trajectory_cost_not_token_count() -> None:
    from asp_scheduler.params import ScheduleParams
    from mindspeed_rl.trainer.online_asp import OnlineAsp

    hook = OnlineAsp({"slow": 10.0, "fast": 10.0}, ScheduleParams(b=2, kappa=0, k=1))
    waits = ToolUse(turns=2, calls=1, errors=0, truncated=0, seconds=4.0)
    quick = ToolUse(turns=2, calls=1, errors=0, truncated=0, seconds=0.0)
    samples = (
        # Same 20 tokens (10 the model's) each; "slow" waited 4 s on its tool.
        _sample("slow", 20, (1,) * 10 + (0,) * 10, waits),
        _sample("fast", 20, (1,) * 10 + (0,) * 10, quick),
    )
    completed = CompletedMinibatch(
        minibatch_id=0, attempt=0, samples=samples, gu_id=0, actor_id=0, policy_version=0,
        started_at=0.0, finished_at=5.0,
    )  # fmt: skip
    hook.observe(completed)
    rate = hook.decode_rate.tokens_per_s
    assert rate == pytest.approx(10.0)  # "slow": 10 model tokens in the 1 s it did not wait
    slow, fast = hook.predictor.estimates(["slow", "fast"])
    assert slow > fast  # the tool wait (4 s x 10 tok/s = 40 token-equivalents) is learned
    assert hook.summary()["decode_tokens_per_s"] == pytest.approx(10.0)
