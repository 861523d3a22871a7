import math

import pytest
import torch

from mindspeed_rl.models.loss import GRPOLossConfig, grpo_loss, masked_token_mean

NAN = float("nan")


def _inputs() -> dict[str, torch.Tensor]:
    # two samples, 3 token slots; sample 0 has 2 response tokens, sample 1 has 1 (3 tokens in all).
    # Padded slots hold NaN/garbage that masking must keep out of every term.
    return {
        "log_probs": torch.tensor([[0.5, 0.0, NAN], [-0.5, NAN, NAN]]),
        "old_log_probs": torch.zeros(2, 3),
        "advantages": torch.tensor([1.0, -1.0]),
        "mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),
        "ref_log_probs": torch.tensor([[0.4, -0.1, 5.0], [-0.6, 5.0, 5.0]]),
        "entropy": torch.tensor([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]]),
    }


def test_grpo_loss_hand_computed() -> None:
    # per-token pg (clip 0.2): s0t0 A=+1 r=e^0.5 -> -1.2 (clipped); s0t1 r=1 -> -1.0;
    # s1t0 A=-1 r=e^-0.5 -> 0.8 (clipped). token-mean: (-1.2 - 1.0 + 0.8) / 3 = -0.466667
    # kl ("kl" = logp - ref) is 0.1 at every real token -> 0.1; entropy mean (1 + 2 + 3) / 3 = 2
    # loss = -0.466667 + 0.5 * 0.1 - 0.1 * 2 = -0.616667; clip_frac = 2 / 3
    cfg = GRPOLossConfig(clip_ratio=0.2, kl_penalty="kl", init_kl_coef=0.5, entropy_coeff=0.1)
    terms = grpo_loss(**_inputs(), config=cfg, num_tokens=3)
    assert terms.pg_loss.item() == pytest.approx(-1.4 / 3, abs=1e-5)
    assert terms.kl.item() == pytest.approx(0.1, abs=1e-5)
    assert terms.entropy.item() == pytest.approx(2.0, abs=1e-6)
    assert terms.clip_frac.item() == pytest.approx(2 / 3, abs=1e-6)
    assert terms.loss.item() == pytest.approx(-1.4 / 3 + 0.05 - 0.2, abs=1e-5)
    assert not math.isnan(terms.loss.item())


def test_micro_batch_terms_sum_to_mini_batch_token_mean() -> None:
    cfg = GRPOLossConfig(clip_ratio=0.2, kl_penalty="low_var_kl", init_kl_coef=0.3, entropy_coeff=0.0)
    full = grpo_loss(**_inputs(), config=cfg, num_tokens=3)
    parts = [
        grpo_loss(**{k: v[i : i + 1] for k, v in _inputs().items()}, config=cfg, num_tokens=3) for i in (0, 1)
    ]
    assert sum(p.loss.item() for p in parts) == pytest.approx(full.loss.item(), abs=1e-6)
    assert sum(p.kl.item() for p in parts) == pytest.approx(full.kl.item(), abs=1e-6)


def test_aggregation_is_token_mean_not_sequence_mean() -> None:
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # token-mean: (1 + 2 + 3) / 3 = 2.0; a per-sequence mean would give (1.5 + 3) / 2 = 2.25
    assert masked_token_mean(values, mask).item() == pytest.approx(2.0)


def test_kl_coef_without_reference_is_an_error() -> None:
    inputs = _inputs()
    del inputs["ref_log_probs"]
    with pytest.raises(ValueError, match="ref_log_probs"):
        grpo_loss(**inputs, config=GRPOLossConfig(init_kl_coef=0.1), num_tokens=3)


def test_config_rejects_unknown_kl_penalty() -> None:
    with pytest.raises(ValueError, match="kl_penalty"):
        GRPOLossConfig(kl_penalty="k3")
