from __future__ import annotations

import pickle
import time

import pytest
from runtime_fakes import complete, make_config, make_schedule

from mindspeed_rl.runtime import (
    Assignment,
    FakeClock,
    GlobalBatch,
    MonotonicClock,
    PromptGroup,
    Sample,
    ScheduledMinibatch,
    WallClock,
)


def test_real_clocks_tell_increasing_time() -> None:
    for clock in (WallClock(), MonotonicClock()):
        first = clock.now()
        assert clock.now() >= first
    assert abs(WallClock().now() - time.time()) < 60.0  # epoch-based, comparable across processes


def test_fake_clock_moves_only_forward() -> None:
    clock = FakeClock(5.0)
    clock.advance(1.5)
    assert clock.now() == 6.5
    clock.set(10.0)
    assert clock.now() == 10.0
    with pytest.raises(ValueError, match="backwards"):
        clock.set(9.0)
    with pytest.raises(ValueError, match="dt >= 0"):
        clock.advance(-1)


def test_records_validate_and_pickle() -> None:
    with pytest.raises(ValueError, match="no prompts"):
        ScheduledMinibatch(minibatch_id=0, prompt_ids=(), batch_group_id=0, predicted_load=0, order_index=0)
    with pytest.raises(ValueError, match="twice"):
        ScheduledMinibatch(
            minibatch_id=0, prompt_ids=("a", "a"), batch_group_id=0, predicted_load=0, order_index=0
        )
    with pytest.raises(ValueError, match="one log-prob per token"):
        Sample(
            prompt_id="a",
            sample_index=0,
            minibatch_id=0,
            response_token_ids=(1, 2),
            rollout_log_probs=(-1.0,),
            reward=None,
            policy_version=0,
            gu_id=0,
            actor_id=0,
            sent_at=0.0,
        )
    mb = make_schedule(1)[0]
    done = complete(
        Assignment(gu_id=0, minibatch=mb, attempt=0, issued_at=0.0),
        actor_id=1,
        policy_version=0,
        num_samples_per_prompt=3,
    )
    assert pickle.loads(pickle.dumps(done)) == done
    batch = GlobalBatch(
        step=4,
        prompts=tuple(
            PromptGroup(
                prompt_id=p, minibatch_id=0, samples=tuple(s for s in done.samples if s.prompt_id == p)
            )
            for p in mb.prompt_ids
        ),
    )
    assert batch.num_prompts == 2 and batch.num_samples == 6 and batch.prompt_ids == mb.prompt_ids
    assert len(batch.samples) == 6


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gu_queue_low": 3, "gu_queue_high": 3}, "gu_queue_low < gu_queue_high"),
        ({"queue_resume_samples": 16}, "below Q_max"),
        ({"queue_max_samples": 7, "queue_resume_samples": 6}, "smaller than one global batch"),
        ({"queue_resume_samples": 5}, "can deadlock"),
        ({"max_policy_lag": 0, "snapshot_interval": 2}, "snapshot_interval - 1"),
        ({"num_samples_per_prompt": 0}, "num_samples_per_prompt must be >= 1"),
    ],
)
def test_config_rejects_settings_that_cannot_work(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_config(**overrides)


def test_config_rejects_minibatches_the_lag_bound_can_never_admit() -> None:
    config = make_config(max_policy_lag=1, num_prompts_per_global_batch=4)
    config.check_minibatch_fits(5)  # (L - 0) * P + 1 = 5
    with pytest.raises(ValueError, match="cannot always be admitted"):
        config.check_minibatch_fits(6)
    make_config(max_policy_lag=None).check_minibatch_fits(10_000)
    stale = make_config(max_policy_lag=2, snapshot_interval=2, num_prompts_per_global_batch=4)
    with pytest.raises(ValueError, match="limit 5"):
        stale.check_minibatch_fits(6)
