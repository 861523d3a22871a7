import math

import pytest
import torch

from mindspeed_rl.models.loss import kl_penalty
from mindspeed_rl.models.loss.kl import LOW_VAR_KL_CLAMP


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # logp = log 0.5, ref = log 0.25 -> logp - ref = log 2 = 0.693147
        ("kl", 0.693147),
        ("abs", 0.693147),
        ("mse", 0.5 * 0.693147**2),  # 0.240227
        # k3: d = ref - logp = -log 2; exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
        ("low_var_kl", 0.193147),
    ],
)
def test_kl_variants_hand_computed(kind: str, expected: float) -> None:
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    torch.testing.assert_close(kl_penalty(logp, ref, kind), torch.tensor([expected]), atol=1e-5, rtol=0)


def test_abs_and_k1_differ_in_sign() -> None:
    logp, ref = torch.tensor([math.log(0.25)]), torch.tensor([math.log(0.5)])
    assert kl_penalty(logp, ref, "kl").item() == pytest.approx(-0.693147, abs=1e-5)
    assert kl_penalty(logp, ref, "abs").item() == pytest.approx(0.693147, abs=1e-5)


def test_low_var_kl_is_clamped() -> None:
    # ref - logp = 20 -> exp(20) - 21 is ~4.85e8, clamped to 10
    out = kl_penalty(torch.tensor([-20.0]), torch.tensor([0.0]), "low_var_kl")
    assert out.item() == LOW_VAR_KL_CLAMP


def test_unknown_kl_names_valid_choices() -> None:
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k3")
