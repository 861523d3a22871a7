"""DAPO's two additions to GRPO, as the plan hands them out: the overlong penalty (the Training
Unit's reward) and dynamic sampling (the rollout scores the filter metric; both loops drop groups
without spread and generate more prompts). Clip-higher and the token-level loss are loss keys
(``sections.loss_config``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mindspeed_rl.contracts import DynamicSampling
from mindspeed_rl.models.rewards.config import RewardConfig
from mindspeed_rl.models.rewards.overlong import OverlongPenalty

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig


def overlong_penalty(config: GRPOConfig) -> OverlongPenalty | None:
    rl = config.rl_config
    if not rl.overlong_buffer_enable:
        return None
    return OverlongPenalty(
        max_tokens=rl.rollout_max_tokens,
        buffer=rl.overlong_buffer,
        factor=rl.overlong_buffer_penalty_factor,
    )


def dynamic_sampling(config: GRPOConfig) -> DynamicSampling | None:
    rl = config.rl_config
    if not rl.filter_groups_enable:
        return None
    return DynamicSampling(
        metric=rl.filter_groups_metric,
        max_batches=None if rl.filter_groups_max_batches == -1 else rl.filter_groups_max_batches,
        train_batch_prompts=rl.filter_groups_train_batch_size,
        generation_batch_prompts=config.num_prompts_per_global_batch,
        scorer=RewardConfig(
            verifier_function=(rl.filter_groups_metric,),
            verifier_weight=(1.0,),
            verifier_parallel=1,
            verifier_timeout=rl.verifier_timeout,
        ),
    )
