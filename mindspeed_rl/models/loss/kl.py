"""Per-token KL penalties between the policy and the frozen reference (``rl_config.kl_penalty``).

All functions take per-token log-probs of the *sampled* tokens and return a per-token estimate;
masking and aggregation happen in :mod:`.aggregate`; the coefficient comes from
:mod:`.kl_control` (fixed or adaptive).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from mindspeed_rl.models.loss.config import KL_PENALTY_NAMES

# k3 can explode when the policy drifts far from the reference; the customary guard (also used by
# the common GRPO stacks) clamps the per-token value to [-10, 10]. k3 is non-negative, so only the
# upper bound ever bites.
LOW_VAR_KL_CLAMP = 10.0


def kl_k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``kl``: the plain log-ratio ``logp - ref_logp`` (unbiased for KL(pi || ref), high variance)."""
    return log_probs - ref_log_probs


def kl_abs(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``abs``: ``|logp - ref_logp|``."""
    return (log_probs - ref_log_probs).abs()


def kl_mse(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``mse``: ``0.5 * (logp - ref_logp)^2`` (the k2 estimator)."""
    return 0.5 * (log_probs - ref_log_probs).square()


def kl_low_var(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``low_var_kl``: k3 = ``exp(ref - logp) - (ref - logp) - 1``, clamped to +-LOW_VAR_KL_CLAMP."""
    log_ratio = ref_log_probs - log_probs
    k3 = torch.exp(log_ratio) - log_ratio - 1.0
    return torch.clamp(k3, min=-LOW_VAR_KL_CLAMP, max=LOW_VAR_KL_CLAMP)


KL_PENALTIES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "kl": kl_k1,
    "abs": kl_abs,
    "mse": kl_mse,
    "low_var_kl": kl_low_var,
}
assert tuple(KL_PENALTIES) == KL_PENALTY_NAMES, "the torch-free config lists the same estimators"


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Dispatch on the upstream ``kl_penalty`` name; unknown names are a user error."""
    fn = KL_PENALTIES.get(kind)
    if fn is None:
        raise ValueError(
            f"unknown kl_penalty {kind!r}; set rl_config.kl_penalty to one of {sorted(KL_PENALTIES)}"
        )
    return fn(log_probs, ref_log_probs)


def sequence_kl(
    log_probs: Sequence[np.ndarray], ref_log_probs: Sequence[np.ndarray], kind: str
) -> np.ndarray:
    """Per-sample SUM over response tokens of the per-token KL estimate (``use_kl_in_reward``)."""
    if len(log_probs) != len(ref_log_probs):
        raise ValueError(
            f"{len(log_probs)} samples of log-probs but {len(ref_log_probs)} of reference log-probs"
        )
    out = np.empty(len(log_probs), dtype=np.float64)
    for i, (lp, ref) in enumerate(zip(log_probs, ref_log_probs)):
        if lp.shape != ref.shape:
            raise ValueError(f"sample {i}: {lp.shape} log-probs vs {ref.shape} reference log-probs")
        per_token = kl_penalty(
            torch.from_numpy(np.asarray(lp, np.float32)), torch.from_numpy(np.asarray(ref, np.float32)), kind
        )
        out[i] = float(per_token.sum().item())
    return out
