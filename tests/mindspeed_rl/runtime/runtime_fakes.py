"""Builders shared by the runtime tests: schedules, completed minibatches, configs."""

from __future__ import annotations

import random

from mindspeed_rl.runtime import (
    Assignment,
    CompletedMinibatch,
    RuntimeConfig,
    Sample,
    ScheduledMinibatch,
)


def make_schedule(
    num_minibatches: int,
    *,
    prompts_per_minibatch: tuple[int, int] = (2, 2),
    group_size: int = 3,
    seed: int = 0,
) -> list[ScheduledMinibatch]:
    """Minibatches ``0..num_minibatches-1`` in order; sizes drawn in ``prompts_per_minibatch``."""
    rng = random.Random(seed)
    schedule, next_prompt = [], 0
    for i in range(num_minibatches):
        size = rng.randint(*prompts_per_minibatch)
        prompts = tuple(f"p{next_prompt + j}" for j in range(size))
        next_prompt += size
        schedule.append(
            ScheduledMinibatch(
                minibatch_id=i,
                prompt_ids=prompts,
                batch_group_id=i // group_size,
                predicted_load=float(rng.randint(50, 500) * size),
                order_index=i,
            )
        )
    return schedule


def make_config(**overrides: object) -> RuntimeConfig:
    settings: dict[str, object] = {
        "num_prompts_per_global_batch": 4,
        "num_samples_per_prompt": 2,
        "queue_max_samples": 16,
        "queue_resume_samples": 8,
        "gu_queue_low": 1,
        "gu_queue_high": 3,
        "max_policy_lag": 2,
    }
    settings.update(overrides)
    return RuntimeConfig(**settings)  # type: ignore[arg-type]


def complete(
    assignment: Assignment,
    *,
    actor_id: int,
    policy_version: int,
    num_samples_per_prompt: int,
    started_at: float = 0.0,
    finished_at: float = 1.0,
    gu_id: int | None = None,
) -> CompletedMinibatch:
    """What an actor would return for ``assignment``: ``n`` fake samples per prompt."""
    mb = assignment.minibatch
    gu = assignment.gu_id if gu_id is None else gu_id
    samples = tuple(
        Sample(
            prompt_id=p,
            sample_index=i,
            minibatch_id=mb.minibatch_id,
            response_token_ids=(1, 2, 3),
            rollout_log_probs=(-0.1, -0.2, -0.3),
            reward=1.0,
            policy_version=policy_version,
            gu_id=gu,
            actor_id=actor_id,
            sent_at=assignment.issued_at,
        )
        for p in mb.prompt_ids
        for i in range(num_samples_per_prompt)
    )
    return CompletedMinibatch(
        minibatch_id=mb.minibatch_id,
        attempt=assignment.attempt,
        samples=samples,
        gu_id=gu,
        actor_id=actor_id,
        policy_version=policy_version,
        started_at=started_at,
        finished_at=finished_at,
    )
