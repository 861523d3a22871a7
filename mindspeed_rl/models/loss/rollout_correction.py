"""Off-policy correction of one micro-batch: the proximal anchor, IS weights, masks and metrics.

Everything acts on per-token log-probs of the sampled tokens (``[B, R]`` with a response mask),
which both engines already have: the megatron engine reduces its vocab-parallel logits to
per-token log-probs before the loss, and a response never spans two micro-batches, so every
per-sequence reduction here (products, sums, means, maxima over a response) is exact whatever
the TP/DP layout. See :mod:`.correction_config` for the three policies and the key names.

Choices made explicit:

* Masked tokens (IcePop bounds, rejection, M2PO) leave the policy-gradient term only; KL and
  entropy still see every response token, and the loss normaliser stays the mini-batch's token
  (or sequence) count, so the sum over micro-batches and DP ranks stays exact without a pre-pass.
* M2PO's mask is found per micro-batch (sort by (log rho)^2, drop the largest until the kept
  mean is <= threshold). Each micro-batch meeting the bound implies the mini-batch meets it.
* Lag = trainer version at the start of the update - the sample's version, clamped at 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mindspeed_rl.models.loss.correction_config import LOG_CLAMP, RolloutCorrectionConfig

STAT_FIELDS = ("tokens", "w_sum", "clipped", "masked", "k3_sum", "logdiff_sum")
METRICS = ("is_weight_mean", "is_clipped_frac", "masked_frac", "kl_k3_behave_vs_train", "ppl_ratio")
MAX_METRICS = ("is_weight_max", "max_abs_log_ratio")
"""Maxima (max-reduced): the largest raw IS weight, and the largest |log pi_theta / pi_b|."""
PREFIX = "rollout_corr/"


@dataclass(frozen=True, slots=True, kw_only=True)
class Correction:
    """What the loss of one micro-batch uses: the anchor of the PPO ratio, the per-token weight
    (None: 1) and the kept tokens (None: all), plus the detached statistics."""

    old_log_probs: torch.Tensor
    weights: torch.Tensor | None
    keep: torch.Tensor | None
    stat_sums: torch.Tensor
    """``[(1 + buckets) * len(STAT_FIELDS)]`` float64: all tokens, then one block per lag bucket."""
    stat_max: torch.Tensor
    """``[(1 + buckets) * len(MAX_METRICS)]`` float64: the maxima, overall and per bucket."""


def safe_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp`` of a log-ratio clamped to [-20, 20] (weights in [e^-20, e^20])."""
    return torch.exp(torch.clamp(log_ratio, -LOG_CLAMP, LOG_CLAMP))


def loglinear_alpha(lag: torch.Tensor, step_fraction: float) -> torch.Tensor:
    """``alpha = (v_prox - v_b) / (v_theta - v_b)`` per token.

    v_prox is the trainer version at the start of the update, v_b the token's version (``lag =
    v_prox - v_b``) and v_theta = v_prox + k / K at the k-th of the update's K optimizer steps (the
    weights move from v_prox to v_prox + 1 over one update). When v_theta == v_b (no lag, first
    step) the current weights ARE the proximal ones: alpha = 1, so pi_prox = pi_theta exactly.
    """
    lag = lag.to(torch.float64)
    denom = lag + float(step_fraction)
    alpha = torch.where(
        denom > 0, lag / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.ones_like(denom)
    )
    return alpha.to(torch.float32)


def m2_keep(sq: torch.Tensor, valid: torch.Tensor, threshold: float) -> torch.Tensor:
    """Kept tokens of M2PO: drop the largest ``sq`` = (log rho)^2 first until the mean over the
    kept valid tokens is <= ``threshold`` (a mean exactly at the threshold is kept)."""
    flat_valid = valid.reshape(-1)
    values = sq.reshape(-1).to(torch.float64)
    idx = torch.nonzero(flat_valid, as_tuple=False).reshape(-1)
    keep = flat_valid.clone()
    n = idx.numel()
    if n == 0:
        return keep.reshape(valid.shape)
    vals = values[idx]
    order = torch.argsort(vals, descending=True, stable=True)
    ordered = vals[order]
    dropped = torch.cat([ordered.new_zeros(1), torch.cumsum(ordered, 0)[:-1]])  # sum of the k largest
    counts = torch.arange(n, 0, -1, dtype=torch.float64, device=vals.device)  # n - k kept
    rest_mean = (ordered.sum() - dropped) / counts
    ok = torch.nonzero(rest_mean <= threshold, as_tuple=False)
    k = int(ok[0].item()) if ok.numel() else n
    keep[idx[order[:k]]] = False
    return keep.reshape(valid.shape)


def _rs_divergence(log_rho: torch.Tensor, valid: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-token (token_*) or per-row broadcast (seq_*) divergence between pi_prox and pi_b."""
    kind = mode.rsplit("_", 1)[1]
    lr = torch.clamp(log_rho, -LOG_CLAMP, LOG_CLAMP)
    if kind == "k1":
        per_token = lr
    elif kind == "k2":
        per_token = 0.5 * lr.square()
    else:
        per_token = torch.exp(lr) - 1.0 - lr
    per_token = torch.where(valid, per_token, torch.zeros_like(per_token))
    if mode.startswith("token_"):
        return per_token.abs() if kind == "k1" else per_token
    counts = valid.sum(dim=-1).clamp(min=1).to(per_token.dtype)
    if mode.startswith("seq_sum_"):
        row = per_token.sum(dim=-1)
    elif mode.startswith("seq_mean_"):
        row = per_token.sum(dim=-1) / counts
    else:  # seq_max_
        row = torch.where(valid, per_token, torch.full_like(per_token, -torch.inf)).amax(dim=-1)
    if kind == "k1":
        row = row.abs()
    return row.unsqueeze(-1).expand_as(per_token)


def correct(
    *,
    log_probs: torch.Tensor,
    behave_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    mask: torch.Tensor,
    lag: torch.Tensor,
    config: RolloutCorrectionConfig | None,
    step_fraction: float = 0.0,
    lag_buckets: Sequence[int] = (),
) -> Correction:
    """The correction of one micro-batch (all inputs ``[B, R]``; ``log_probs`` carries the grad).

    ``old_log_probs``: the batch's old log-probs (recomputed with the weights at the start of the
    update), or None when the pipeline skipped that forward (one optimizer step: they equal the
    current ones). ``config`` None: no correction, statistics only (as in bypass).
    """
    valid = mask.bool()
    current = log_probs.detach()
    mode = "bypass" if config is None else config.mode
    if mode == "bypass":
        anchor = behave_log_probs
    elif config is not None and config.prox_logp == "loglinear":
        alpha = loglinear_alpha(lag, step_fraction)
        anchor = behave_log_probs + alpha * (current - behave_log_probs)
    else:
        anchor = current if old_log_probs is None else old_log_probs
    # rho: pi_prox / pi_b (decoupled); in bypass pi_prox = pi_b, so the divergence the masks and
    # metrics see is that of the current weights, pi_theta / pi_b (verl's bypass definition).
    log_rho = (anchor if mode == "decoupled" else current) - behave_log_probs
    log_rho = torch.where(valid, log_rho, torch.zeros_like(log_rho))
    level = None if config is None else config.rollout_is
    if level == "sequence":
        raw = safe_exp(log_rho.sum(dim=-1, keepdim=True)).expand_as(log_rho)
    else:
        raw = safe_exp(log_rho)
    keep = valid.clone()
    clipped = torch.zeros_like(valid)
    weights: torch.Tensor | None = None
    if config is not None and config.rollout_is is not None:
        if config.is_bounds is not None:
            lo, hi = config.is_bounds
            outside = valid & ((raw < lo) | (raw > hi))
            keep &= ~outside
            clipped |= outside
            weights = raw if mode == "decoupled" else None
        elif config.is_upper is not None:
            clipped |= valid & (raw > config.is_upper)
            weights = torch.clamp(raw, max=config.is_upper)
    if config is not None and config.rollout_rs is not None:
        assert config.rollout_rs_threshold is not None
        keep &= ~(_rs_divergence(log_rho, valid, config.rollout_rs) > config.rollout_rs_threshold)
    if config is not None and config.m2_threshold is not None:
        keep &= m2_keep(log_rho.square(), keep, config.m2_threshold)
    masked = valid & ~keep
    sums, maxes = _stats(current, behave_log_probs, raw, clipped, masked, valid, lag, lag_buckets)
    any_mask = config is not None and (
        config.is_bounds is not None or config.rollout_rs is not None or config.m2_threshold is not None
    )
    return Correction(
        old_log_probs=anchor,
        weights=None if weights is None else torch.where(valid, weights, torch.zeros_like(weights)),
        keep=keep if any_mask else None,
        stat_sums=sums,
        stat_max=maxes,
    )


def _stats(
    current: torch.Tensor,
    behave: torch.Tensor,
    raw: torch.Tensor,
    clipped: torch.Tensor,
    masked: torch.Tensor,
    valid: torch.Tensor,
    lag: torch.Tensor,
    buckets: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    log_r = torch.clamp(current - behave, -LOG_CLAMP, LOG_CLAMP).double()
    per_token = torch.stack(
        [
            torch.ones_like(log_r),
            raw.double(),
            clipped.double(),
            masked.double(),
            torch.exp(log_r) - 1.0 - log_r,  # k3 estimate of KL(pi_b || pi_theta), samples from pi_b
            -log_r,  # log pi_b - log pi_theta: its token-mean is log(ppl_theta / ppl_b)
        ]
    )
    selections = [valid, *[valid & (lag == b) for b in buckets]]
    sums, maxes = [], []
    for sel in selections:
        picked = torch.where(sel, per_token, torch.zeros_like(per_token))
        sums.append(picked.sum(dim=(1, 2)))
        zero = torch.zeros_like(log_r)
        maxes.append(torch.where(sel, raw.double(), zero).amax().reshape(1))
        maxes.append(torch.where(sel, log_r.abs(), zero).amax().reshape(1))
    return torch.cat(sums), torch.cat(maxes)


def stats_size(num_buckets: int) -> tuple[int, int]:
    """Lengths of ``Correction.stat_sums`` and ``stat_max`` for ``num_buckets`` lag buckets."""
    return (1 + num_buckets) * len(STAT_FIELDS), (1 + num_buckets) * len(MAX_METRICS)


def correction_metrics(
    sums: Sequence[float], maxes: Sequence[float], buckets: Sequence[int]
) -> dict[str, float]:
    """``rollout_corr/*`` (overall) and ``rollout_corr/lag_<L>/*`` from the summed statistics."""
    import math

    out: dict[str, float] = {}
    width = len(STAT_FIELDS)
    names = ["", *[f"lag_{b}/" for b in buckets]]
    for j, name in enumerate(names):
        tokens, w_sum, clipped, masked, k3, logdiff = sums[j * width : (j + 1) * width]
        if tokens <= 0:
            continue
        values = (
            w_sum / tokens,
            clipped / tokens,
            masked / tokens,
            k3 / tokens,
            math.exp(min(max(logdiff / tokens, -LOG_CLAMP), LOG_CLAMP)),
        )
        out.update({f"{PREFIX}{name}{m}": float(v) for m, v in zip(METRICS, values, strict=True)})
        peaks = maxes[j * len(MAX_METRICS) : (j + 1) * len(MAX_METRICS)]
        out.update({f"{PREFIX}{name}{m}": float(v) for m, v in zip(MAX_METRICS, peaks, strict=True)})
    return out
