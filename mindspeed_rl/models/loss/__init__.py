"""GRPO loss family: advantages, clipped policy loss, KL penalties and controllers, entropy, aggregation.

The loss functions are torch; their settings (:mod:`.config`, :mod:`.kl_control`) are not, and the
config mapper imports them on machines without torch. So this package init imports nothing
eagerly: names resolve on first use (PEP 562), and importing ``mindspeed_rl.models.loss.config``
never pulls torch in.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mindspeed_rl.models.loss.advantages import group_norm_advantages
    from mindspeed_rl.models.loss.aggregate import (
        masked_sequence_mean,
        masked_token_mean,
        masked_token_sum,
    )
    from mindspeed_rl.models.loss.config import GRPOLossConfig
    from mindspeed_rl.models.loss.entropy import entropy_from_logits
    from mindspeed_rl.models.loss.grpo import GRPOLossTerms, grpo_loss
    from mindspeed_rl.models.loss.kl import KL_PENALTIES, kl_penalty
    from mindspeed_rl.models.loss.kl_control import KLController, build_kl_controller
    from mindspeed_rl.models.loss.policy import clipped_policy_loss

_WHERE = {
    "group_norm_advantages": "advantages",
    "masked_sequence_mean": "aggregate",
    "masked_token_mean": "aggregate",
    "masked_token_sum": "aggregate",
    "GRPOLossConfig": "config",
    "entropy_from_logits": "entropy",
    "GRPOLossTerms": "grpo",
    "grpo_loss": "grpo",
    "KL_PENALTIES": "kl",
    "kl_penalty": "kl",
    "KLController": "kl_control",
    "build_kl_controller": "kl_control",
    "clipped_policy_loss": "policy",
}
__all__ = [
    "KL_PENALTIES",
    "GRPOLossConfig",
    "GRPOLossTerms",
    "KLController",
    "build_kl_controller",
    "clipped_policy_loss",
    "entropy_from_logits",
    "group_norm_advantages",
    "grpo_loss",
    "kl_penalty",
    "masked_sequence_mean",
    "masked_token_mean",
    "masked_token_sum",
]
assert sorted(__all__) == sorted(_WHERE), "every lazy name is exported"


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
