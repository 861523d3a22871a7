"""Clip-higher, sequence-level aggregation, KL in reward and the adaptive KL controller."""

import math

import numpy as np
import pytest
import torch

from mindspeed_rl.models.loss import GRPOLossConfig, clipped_policy_loss, grpo_loss, masked_sequence_mean
from mindspeed_rl.models.loss.kl import sequence_kl
from mindspeed_rl.models.loss.kl_control import build_kl_controller


def test_clip_higher_raises_only_the_upper_bound() -> None:
    # ratios e^0.22 = 1.246 with A > 0: clipped at 1.2 symmetric, not at 1 + 0.28.
    logp, old, adv = torch.full((4,), 0.22), torch.zeros(4), torch.ones(4)
    _, symmetric = clipped_policy_loss(logp, old, adv, 0.2)
    _, higher = clipped_policy_loss(logp, old, adv, 0.2, 0.28)
    assert symmetric.sum().item() == 4 and higher.sum().item() == 0
    # the lower bound is unchanged: ratio e^-0.3 = 0.74 with A < 0 is clipped either way
    _, low = clipped_policy_loss(torch.full((1,), -0.3), torch.zeros(1), -torch.ones(1), 0.2, 0.28)
    assert low.item() == 1


def test_clip_higher_changes_the_clipped_fraction_of_the_loss() -> None:
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(8, 16, generator=g) * 0.2
    inputs = dict(log_probs=logp, old_log_probs=torch.zeros(8, 16), advantages=torch.ones(8),
                  mask=torch.ones(8, 16), num_tokens=128)  # fmt: skip
    base = grpo_loss(**inputs, config=GRPOLossConfig(init_kl_coef=0.0))
    dapo = grpo_loss(
        **inputs, config=GRPOLossConfig(init_kl_coef=0.0, clip_ratio_low=0.2, clip_ratio_high=0.28)
    )
    assert dapo.clip_frac.item() < base.clip_frac.item() - 0.02


def _two_sequences() -> dict[str, torch.Tensor]:
    return {
        "log_probs": torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
        "old_log_probs": torch.zeros(2, 3),
        "advantages": torch.tensor([1.0, -2.0]),
        "mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
    }


def test_sequence_level_loss_weighs_every_response_equally() -> None:
    # ratio 1 -> per-token pg = -A: sample 0 has 3 tokens of -1, sample 1 one token of +2.
    # token-mean (-3 + 2) / 4 = -0.25; sequence-mean (-1 + 2) / 2 = 0.5
    token = grpo_loss(**_two_sequences(), config=GRPOLossConfig(init_kl_coef=0.0), num_tokens=4)
    seq_cfg = GRPOLossConfig(init_kl_coef=0.0, token_level_loss=False)
    seq = grpo_loss(**_two_sequences(), config=seq_cfg, num_tokens=4, num_sequences=2)
    assert token.pg_loss.item() == pytest.approx(-0.25)
    assert seq.pg_loss.item() == pytest.approx(0.5)
    parts = [
        grpo_loss(
            **{k: v[i : i + 1] for k, v in _two_sequences().items()},
            config=seq_cfg,
            num_tokens=4,
            num_sequences=2,
        )  # fmt: skip
        for i in (0, 1)
    ]
    assert sum(p.pg_loss.item() for p in parts) == pytest.approx(0.5)  # exact across micro-batches
    with pytest.raises(ValueError, match="num_sequences"):
        grpo_loss(**_two_sequences(), config=seq_cfg, num_tokens=4)


def test_masked_sequence_mean_ignores_padding() -> None:
    values = torch.tensor([[1.0, 3.0, float("nan")], [5.0, float("nan"), float("nan")]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_sequence_mean(values, mask).item() == pytest.approx((2.0 + 5.0) / 2)


def test_kl_in_reward_takes_the_kl_out_of_the_loss() -> None:
    inputs = {**_two_sequences(), "ref_log_probs": torch.full((2, 3), -0.5)}
    in_loss = grpo_loss(**inputs, config=GRPOLossConfig(kl_penalty="kl", init_kl_coef=0.5), num_tokens=4)
    in_reward = grpo_loss(
        **inputs,
        config=GRPOLossConfig(kl_penalty="kl", init_kl_coef=0.5, use_kl_in_reward=True),
        num_tokens=4,
    )
    assert in_loss.kl.item() == pytest.approx(0.5) and in_reward.kl.item() == pytest.approx(0.5)
    assert in_loss.loss.item() == pytest.approx(in_reward.loss.item() + 0.25)


def test_sequence_kl_sums_the_per_token_estimate() -> None:
    logp = [np.array([0.0, -1.0], np.float32), np.array([-2.0], np.float32)]
    ref = [np.array([-0.5, -1.0], np.float32), np.array([-1.0], np.float32)]
    np.testing.assert_allclose(sequence_kl(logp, ref, "kl"), [0.5, -1.0], atol=1e-6)
    np.testing.assert_allclose(sequence_kl(logp, ref, "abs"), [0.5, 1.0], atol=1e-6)


def test_adaptive_controller_follows_the_ppo_rule() -> None:
    cfg = GRPOLossConfig(init_kl_coef=0.1, kl_ctrl_type="adaptive", kl_target=0.01, kl_horizon=100)
    ctl = build_kl_controller(cfg)
    ctl.update(0.05, 10)  # kl 5x target: error clipped to +0.2 -> x (1 + 0.2 * 10 / 100)
    assert ctl.value == pytest.approx(0.1 * 1.02)
    ctl.update(0.01 * 0.95, 100)  # error -0.05 -> x 0.95
    assert ctl.value == pytest.approx(0.1 * 1.02 * 0.95)
    fixed = build_kl_controller(GRPOLossConfig(init_kl_coef=0.1))
    fixed.update(5.0, 1000)
    assert fixed.value == 0.1


def test_adaptive_without_target_or_horizon_names_them() -> None:
    with pytest.raises(ValueError, match=r"rl_config\.kl_target and rl_config\.kl_horizon"):
        GRPOLossConfig(kl_ctrl_type="adaptive")
    assert math.isclose(GRPOLossConfig(clip_ratio=0.3).clip_high, 0.3)
