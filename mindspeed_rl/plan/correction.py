"""``rollout_correction`` onto the engine's correction settings, and the old log-probs it needs.

Torch-free. The section is resolved once here: ``mode: null`` becomes the pipeline's own anchor
(async: bypass, the rollout log-probs; hybrid: decoupled around the trainer's recomputed
log-probs, which is what its loss already is), and a section with every key null is no
correction at all, so the loss is today's bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, cast

from mindspeed_rl.models.loss.correction_config import RolloutCorrectionConfig, parse_is_threshold

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.contracts import OldLogProbs


def rollout_correction(config: GRPOConfig) -> RolloutCorrectionConfig | None:
    s = config.rollout_correction
    given = (
        s.mode, s.prox_logp, s.rollout_is, s.rollout_is_threshold, s.rollout_rs,
        s.rollout_rs_threshold, s.m2_threshold,
    )  # fmt: skip
    if all(v is None for v in given):
        return None
    if s.mode == "bypass" and s.prox_logp is not None:
        raise ValueError(
            f"rollout_correction.prox_logp={s.prox_logp!r} only applies to mode: decoupled (bypass "
            "anchors the ratio to the rollout log-probs); remove it or set mode: decoupled"
        )
    mode = (
        s.mode if s.mode is not None else ("bypass" if config.rl_config.pipeline == "async" else "decoupled")
    )
    upper, bounds = parse_is_threshold(s.rollout_is_threshold, s.rollout_is)
    return RolloutCorrectionConfig(
        mode=cast(Literal["bypass", "decoupled"], mode),
        prox_logp=cast(Literal["recompute", "loglinear"], s.prox_logp or "recompute"),
        rollout_is=cast(Literal["token", "sequence"] | None, s.rollout_is),
        is_upper=upper,
        is_bounds=bounds,
        rollout_rs=s.rollout_rs,
        rollout_rs_threshold=s.rollout_rs_threshold,
        m2_threshold=s.m2_threshold,
    )


def old_log_probs(config: GRPOConfig, optimizer_steps: int) -> OldLogProbs:
    """Which log-probs the Training Unit puts in the batch as ``old``.

    Without a correction, today's rule: async the rollout's; hybrid recomputed when several
    optimizer steps share a batch, else none (the ratio is exactly 1); the rollout's too when
    several hybrid iterations share one DAPO generation batch. bypass: the rollout's.
    decoupled + recompute: recomputed with the weights at the start of the update (the hybrid
    skips that forward for one step, where they equal the current ones). decoupled + loglinear:
    the rollout's (no forward; the engine interpolates the proximal log-probs).
    """
    is_async = config.rl_config.pipeline == "async"
    # Hybrid DAPO training several iterations on one generation batch (filter_groups_train_batch_size
    # below global_batch_size): the later ones train samples of weights already stepped past, so
    # only the rollout's log-probs are the behaviour policy, as in the async pipeline.
    shared = (
        config.rl_config.filter_groups_enable
        and config.num_prompts_per_step < config.num_prompts_per_global_batch
    )
    today: OldLogProbs = (
        "rollout" if is_async or shared else ("recompute" if optimizer_steps > 1 else "current")
    )
    corr = rollout_correction(config)
    if corr is None:
        return today
    if corr.mode == "bypass" or corr.prox_logp == "loglinear":
        return "rollout"
    return "recompute" if is_async or shared else today
