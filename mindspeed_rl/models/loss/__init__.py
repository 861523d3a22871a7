"""GRPO loss family: advantages, clipped policy loss, KL penalties, entropy, token aggregation.

Pure torch functions; imported only by the training engines (torch is a hard dependency here).
"""

from mindspeed_rl.models.loss.advantages import group_norm_advantages
from mindspeed_rl.models.loss.aggregate import masked_token_mean, masked_token_sum
from mindspeed_rl.models.loss.entropy import entropy_from_logits
from mindspeed_rl.models.loss.grpo import GRPOLossConfig, GRPOLossTerms, grpo_loss
from mindspeed_rl.models.loss.kl import KL_PENALTIES, kl_penalty
from mindspeed_rl.models.loss.policy import clipped_policy_loss

__all__ = [
    "KL_PENALTIES",
    "GRPOLossConfig",
    "GRPOLossTerms",
    "clipped_policy_loss",
    "entropy_from_logits",
    "group_norm_advantages",
    "grpo_loss",
    "kl_penalty",
    "masked_token_mean",
    "masked_token_sum",
]
