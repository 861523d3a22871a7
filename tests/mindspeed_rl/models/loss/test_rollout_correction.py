"""The off-policy correction: each formula against hand-computed values, masks at their
thresholds, and every mode equal to plain PPO (loss and gradient, bit for bit) at zero lag."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from mindspeed_rl.models.loss.config import GRPOLossConfig
from mindspeed_rl.models.loss.correction_config import RolloutCorrectionConfig, parse_is_threshold
from mindspeed_rl.models.loss.grpo import grpo_loss
from mindspeed_rl.models.loss.rollout_correction import (
    correct,
    correction_metrics,
    loglinear_alpha,
    m2_keep,
    safe_exp,
)
from mindspeed_rl.models.training.batch import TrainBatch, pad_batch
from mindspeed_rl.models.training.update_loop import LossSums, MiniBatchLoss, lag_buckets, loss_term_values

MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
LAG0 = torch.zeros(2, 3, dtype=torch.long)


def _lp(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_loglinear_alpha_by_hand() -> None:
    lag = torch.tensor([0, 1, 3])
    assert loglinear_alpha(lag, 0.0).tolist() == [1.0, 1.0, 1.0]  # first step: prox == theta
    got = loglinear_alpha(lag, 0.5).tolist()
    assert got == pytest.approx([0.0, 1 / 1.5, 3 / 3.5])


def test_loglinear_anchor_interpolates_between_behaviour_and_current() -> None:
    current = _lp([-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0])
    behave = _lp([-2.0, -2.5, -3.5], [-1.5, -0.5, 0.0])
    lag = torch.tensor([[2, 2, 2], [0, 0, 0]])
    cfg = RolloutCorrectionConfig(mode="decoupled", prox_logp="loglinear")
    out = correct(log_probs=current, behave_log_probs=behave, old_log_probs=None, mask=MASK, lag=lag,
                  config=cfg, step_fraction=0.5)  # fmt: skip
    # row 0: alpha = 2 / 2.5 = 0.8; row 1: lag 0 at k/K = 0.5 -> alpha 0 (pi_prox = pi_b)
    want0 = behave[0] + 0.8 * (current[0] - behave[0])
    assert torch.allclose(out.old_log_probs[0], want0)
    assert torch.equal(out.old_log_probs[1], behave[1])


def test_safety_clamp() -> None:
    assert safe_exp(torch.tensor([100.0, -100.0])).tolist() == pytest.approx([math.exp(20), math.exp(-20)])


def test_decoupled_token_tis_loss_by_hand() -> None:
    """loss_t = w_t * max(-A r_t, -A clip(r_t, 0.8, 1.2)), r = pi_theta / pi_prox, w = min(pi_prox / pi_b, 2)."""
    current = _lp([-1.0, -0.5, -2.0], [-0.3, -0.2, 0.0])
    prox = _lp([-1.1, -0.5, -1.5], [-0.3, -0.4, 0.0])
    behave = _lp([-2.0, -0.4, -1.5], [-0.1, -0.4, 0.0])
    adv = torch.tensor([1.0, -1.0])
    cfg = RolloutCorrectionConfig(mode="decoupled", rollout_is="token", is_upper=2.0)
    corr = correct(
        log_probs=current, behave_log_probs=behave, old_log_probs=prox, mask=MASK, lag=LAG0, config=cfg
    )
    terms = grpo_loss(log_probs=current, old_log_probs=corr.old_log_probs, advantages=adv, mask=MASK,
                      config=GRPOLossConfig(init_kl_coef=0.0), num_tokens=5, pg_weights=corr.weights)  # fmt: skip
    total = 0.0
    for b in range(2):
        for t in range(3 if b == 0 else 2):
            r = math.exp(current[b, t] - prox[b, t])
            w = min(math.exp(prox[b, t] - behave[b, t]), 2.0)
            a = float(adv[b])
            total += w * max(-a * r, -a * min(max(r, 0.8), 1.2))
    assert float(terms.loss) == pytest.approx(total / 5, rel=1e-6)
    # token (0,0): w = e^0.9 = 2.46 -> truncated; the others are under 2
    assert float(corr.stat_sums[2]) == 1.0  # clipped count (all tokens block)


def test_sequence_weight_is_the_product_and_truncated() -> None:
    current = _lp([-1.0, -1.0, -1.0], [-1.0, -1.0, 0.0])
    behave = _lp([-1.2, -1.3, -1.0], [-0.9, -1.0, 0.0])
    cfg = RolloutCorrectionConfig(mode="decoupled", rollout_is="sequence", is_upper=1.5)
    corr = correct(
        log_probs=current, behave_log_probs=behave, old_log_probs=current, mask=MASK, lag=LAG0, config=cfg
    )
    assert corr.weights is not None
    row0 = min(math.exp(0.2 + 0.3 + 0.0), 1.5)  # e^0.5 = 1.65 -> 1.5
    row1 = math.exp(-0.1)
    assert corr.weights[0].tolist() == pytest.approx([row0] * 3)
    assert corr.weights[1, :2].tolist() == pytest.approx([row1] * 2)
    assert float(corr.weights[1, 2]) == 0.0  # padding


def test_lo_hi_bounds_mask_outside_and_keep_the_bounds_themselves() -> None:
    lo, hi = parse_is_threshold("0.5_2.0", "token")[1] or (0, 0)
    assert (lo, hi) == (0.5, 2.0)
    behave = torch.zeros(2, 3)
    # weights pi_prox / pi_b: exactly 0.5, 2.0 and 1 (kept); 0.49, 2.01 (masked)
    prox = torch.log(torch.tensor([[0.5, 2.0, 1.0], [0.49, 2.01, 1.0]]))
    cfg = RolloutCorrectionConfig(mode="decoupled", rollout_is="token", is_bounds=(lo, hi))
    corr = correct(
        log_probs=prox, behave_log_probs=behave, old_log_probs=prox, mask=MASK, lag=LAG0, config=cfg
    )
    assert corr.keep is not None
    assert corr.keep.tolist() == [[True, True, True], [False, False, False]]  # (1,2) is padding


def test_rejection_thresholds() -> None:
    behave = torch.zeros(2, 3)
    prox = _lp([0.1, -0.1, 0.0], [0.3, 0.0, 0.0])
    token = RolloutCorrectionConfig(mode="decoupled", rollout_rs="token_k1", rollout_rs_threshold=0.1)
    keep = correct(
        log_probs=prox, behave_log_probs=behave, old_log_probs=prox, mask=MASK, lag=LAG0, config=token
    ).keep
    assert keep is not None and keep.tolist() == [
        [True, True, True],
        [False, True, False],
    ]  # |0.1| == 0.1 kept
    # seq_mean_k2: row 0 mean of 0.5 * lr^2 = (0.005 + 0.005 + 0) / 3; row 1 = 0.045 / 2
    seq = RolloutCorrectionConfig(mode="decoupled", rollout_rs="seq_mean_k2", rollout_rs_threshold=0.01)
    keep = correct(
        log_probs=prox, behave_log_probs=behave, old_log_probs=prox, mask=MASK, lag=LAG0, config=seq
    ).keep
    assert keep is not None and keep.tolist() == [[True, True, True], [False, False, False]]
    seq_max = RolloutCorrectionConfig(mode="decoupled", rollout_rs="seq_max_k3", rollout_rs_threshold=0.0051)
    keep = correct(log_probs=prox, behave_log_probs=behave, old_log_probs=prox, mask=MASK, lag=LAG0,
                   config=seq_max).keep  # fmt: skip
    # k3(0.1) = e^0.1 - 1.1 = 0.00517 > 0.0051; k3(-0.1) = 0.00484; row 0 max 0.00517 -> rejected
    assert keep is not None and keep.tolist() == [[False, False, False], [False, False, False]]


def test_m2_drops_the_largest_until_the_mean_fits() -> None:
    sq = torch.tensor([[0.01, 0.09, 0.04, 0.0]])
    valid = torch.ones(1, 4, dtype=torch.bool)
    assert m2_keep(sq, valid, 0.04).tolist() == [[True, True, True, True]]  # mean 0.035
    assert m2_keep(sq, valid, 0.02).tolist() == [[True, False, True, True]]  # 0.05 / 3 = 0.0167
    # 0.01 / 2 = 0.005 is still > 0.004: only the 0.0 token stays
    assert m2_keep(sq, valid, 0.004).tolist() == [[False, False, False, True]]
    assert m2_keep(sq, valid, 0.005).tolist() == [[True, False, False, True]]  # exactly at the bound
    assert m2_keep(torch.tensor([[0.02, 0.02]]), torch.ones(1, 2, dtype=torch.bool), 0.02).tolist() == [
        [True, True]
    ]
    assert m2_keep(torch.tensor([[0.5, 0.3]]), torch.ones(1, 2, dtype=torch.bool), 0.1).tolist() == [
        [False, False]
    ]


CONFIGS = [
    RolloutCorrectionConfig(mode="bypass"),
    RolloutCorrectionConfig(mode="bypass", rollout_is="token", is_bounds=(0.5, 2.0)),
    RolloutCorrectionConfig(mode="bypass", rollout_rs="token_k3", rollout_rs_threshold=0.01),
    RolloutCorrectionConfig(mode="decoupled"),
    RolloutCorrectionConfig(mode="decoupled", rollout_is="token", is_upper=2.0),
    RolloutCorrectionConfig(mode="decoupled", rollout_is="sequence", is_upper=2.0,
                            rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
    RolloutCorrectionConfig(mode="decoupled", prox_logp="loglinear", rollout_is="token", is_upper=2.0),
    RolloutCorrectionConfig(mode="decoupled", prox_logp="loglinear", m2_threshold=0.04),
    RolloutCorrectionConfig(mode="decoupled", rollout_is="token", is_bounds=(0.5, 2.0), rollout_rs="seq_max_k2",
                            rollout_rs_threshold=0.1, m2_threshold=0.04),
]  # fmt: skip


def _batch(current: list[np.ndarray], *, versions: int | None) -> TrainBatch:
    rng = np.random.default_rng(0)
    return TrainBatch.from_lists(
        prompt_ids=[[1, 2], [3], [4, 5, 6]],
        response_ids=[[7, 8, 9], [1, 2], [3, 4, 5, 6]],
        advantages=[0.7, -1.2, 0.4],
        old_log_probs=current,
        ref_log_probs=[c + rng.normal(scale=0.1, size=c.shape).astype(np.float32) for c in current],
        rollout_log_probs=None if versions is None else current,
        versions=None if versions is None else [np.full(c.shape, versions) for c in current],
    )


@pytest.mark.parametrize("token_level", [True, False])
@pytest.mark.parametrize(
    "cfg", CONFIGS, ids=lambda c: f"{c.mode}-{c.prox_logp}-{c.rollout_is}-{c.rollout_rs}-{c.m2_threshold}"
)
def test_zero_lag_identical_log_probs_every_mode_is_plain_ppo_exactly(
    cfg: RolloutCorrectionConfig, token_level: bool
) -> None:
    """pi_theta == pi_prox == pi_b and no lag: every weight is exactly 1, nothing is masked."""
    rng = np.random.default_rng(3)
    current = [rng.normal(-1.0, 0.3, size=n).astype(np.float32) for n in (3, 2, 4)]
    loss_cfg = GRPOLossConfig(init_kl_coef=0.05, token_level_loss=token_level)

    def run(batch: TrainBatch, config: GRPOLossConfig) -> tuple[torch.Tensor, torch.Tensor]:
        padded = pad_batch(batch, pad_token_id=0)
        assert padded.old_log_probs is not None
        logp = padded.old_log_probs.clone().requires_grad_(True)
        terms = MiniBatchLoss(mini=batch, temperature=1.0, kl_coef=0.05, config=config, policy_version=5)(
            padded, logp, None
        )
        terms.loss.backward()
        assert logp.grad is not None
        return terms.loss.detach(), logp.grad

    plain_loss, plain_grad = run(_batch(current, versions=None), loss_cfg)
    loss, grad = run(_batch(current, versions=5), dataclasses.replace(loss_cfg, rollout_correction=cfg))
    assert torch.equal(loss, plain_loss)
    assert torch.equal(grad, plain_grad)


def test_no_section_with_rollout_log_probs_keeps_the_loss_bit_identical_and_reports_metrics() -> None:
    rng = np.random.default_rng(4)
    current = [rng.normal(-1.0, 0.3, size=n).astype(np.float32) for n in (3, 2, 4)]
    rollout = [c + rng.normal(scale=0.05, size=c.shape).astype(np.float32) for c in current]
    with_rollout = dataclasses.replace(_batch(current, versions=3), rollout_log_probs=tuple(rollout))
    cfg = GRPOLossConfig(init_kl_coef=0.05)
    losses = []
    for batch in (_batch(current, versions=None), with_rollout):
        padded = pad_batch(batch, pad_token_id=0)
        logp = (padded.old_log_probs + 0.01).requires_grad_(True)  # type: ignore[operator]
        loss = MiniBatchLoss(mini=batch, temperature=1.0, kl_coef=0.05, config=cfg, policy_version=4,
                             lag_buckets=lag_buckets(batch, 4))  # fmt: skip
        terms = loss(padded, logp, None)
        losses.append(terms)
    assert torch.equal(losses[0].loss, losses[1].loss)
    assert losses[0].correction_sums is None and losses[1].correction_sums is not None
    sums = LossSums("cpu", MiniBatchLoss(mini=with_rollout, temperature=1.0, kl_coef=0.0, config=cfg,
                                         lag_buckets=(1,)).stats_size)  # fmt: skip
    sums.add(loss_term_values(losses[1]))
    totals = sums.totals()
    assert totals["rc_sum:0"] == 9.0  # response tokens
    assert totals["rc_sum:6"] == 9.0  # all at lag 1 (version 3, trainer 4)


def test_metrics_by_hand() -> None:
    # all + lag_0 + lag_2 blocks of (tokens, w_sum, clipped, masked, k3, logdiff)
    sums = [4, 6.0, 1, 2, 0.4, 0.2, 3, 3.0, 0, 0, 0.0, 0.0, 1, 3.0, 1, 2, 0.4, 0.2]
    maxes = [3.0, 1.1, 1.0, 0.0, 3.0, 1.1]
    got = correction_metrics(sums, maxes, (0, 2))
    assert got["rollout_corr/is_weight_mean"] == 1.5
    assert got["rollout_corr/is_weight_max"] == 3.0
    assert got["rollout_corr/is_clipped_frac"] == 0.25
    assert got["rollout_corr/masked_frac"] == 0.5
    assert got["rollout_corr/kl_k3_behave_vs_train"] == pytest.approx(0.1)
    assert got["rollout_corr/ppl_ratio"] == pytest.approx(math.exp(0.05))
    assert got["rollout_corr/max_abs_log_ratio"] == 1.1
    assert got["rollout_corr/lag_0/is_weight_mean"] == 1.0
    assert got["rollout_corr/lag_2/masked_frac"] == 2.0
    assert "rollout_corr/lag_1/is_weight_mean" not in got


def test_stats_split_by_lag() -> None:
    current = _lp([-1.0, -1.0, -1.0], [-1.0, -1.0, 0.0])
    behave = _lp([-1.5, -1.0, -1.0], [-1.0, -1.0, 0.0])
    lag = torch.tensor([[2, 2, 2], [0, 0, 0]])
    out = correct(log_probs=current, behave_log_probs=behave, old_log_probs=None, mask=MASK, lag=lag,
                  config=None, lag_buckets=(0, 2))  # fmt: skip
    got = correction_metrics(out.stat_sums.tolist(), out.stat_max.tolist(), (0, 2))
    assert got["rollout_corr/lag_0/is_weight_mean"] == 1.0
    assert got["rollout_corr/lag_2/is_weight_max"] == pytest.approx(math.exp(0.5))
    assert got["rollout_corr/lag_2/is_weight_mean"] == pytest.approx((math.exp(0.5) + 2) / 3)
    k3 = math.exp(0.5) - 1 - 0.5
    assert got["rollout_corr/kl_k3_behave_vs_train"] == pytest.approx(k3 / 5)
    assert got["rollout_corr/ppl_ratio"] == pytest.approx(math.exp(-0.5 / 5))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"mode": "offpolicy"}, "['bypass', 'decoupled']"),
        ({"prox_logp": "approx"}, "['recompute', 'loglinear']"),
        ({"rollout_is": "geometric"}, "['token', 'sequence']"),
        ({"rollout_rs": "token_k9", "rollout_rs_threshold": 1.0}, "token_k1"),
        ({"rollout_rs": "token_k1"}, "go together"),
        ({"mode": "bypass", "rollout_is": "token", "is_upper": 2.0}, "mode: decoupled"),
        ({"is_upper": 2.0}, "without rollout_is"),
        ({"m2_threshold": 0.0}, "m2_threshold"),
    ],
)
def test_bad_settings_name_the_valid_ones(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        RolloutCorrectionConfig(**kwargs)  # type: ignore[arg-type]
    assert needle in str(err.value)


def test_lo_hi_string_must_parse() -> None:
    assert parse_is_threshold(None, "token") == (2.0, None)
    assert parse_is_threshold(3, "token") == (3.0, None)
    with pytest.raises(ValueError, match="lo_hi"):
        parse_is_threshold("half", "token")
