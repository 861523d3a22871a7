import math

import pytest
import torch

from mindspeed_rl.models.loss import clipped_policy_loss


def test_clipping_on_both_sides() -> None:
    # clip_ratio 0.2; ratios exp(+-0.5) = 1.648721 / 0.606531
    # A=+1, r=1.6487: max(-1.6487, -1.2) = -1.2      (upper clip active)
    # A=+1, r=0.6065: max(-0.6065, -0.8) = -0.6065   (no clip: low ratio with A>0 keeps gradient)
    # A=-1, r=0.6065: max(0.6065, 0.8)   = 0.8       (lower clip active)
    # A=-1, r=1.6487: max(1.6487, 1.2)   = 1.6487    (no clip: high ratio with A<0 keeps gradient)
    # A=+2, r=1:      -2                              (no clip)
    delta = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0])
    loss, clipped = clipped_policy_loss(delta, torch.zeros(5), adv, 0.2)
    expected = torch.tensor([-1.2, -math.exp(-0.5), 0.8, math.exp(0.5), -2.0])
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=0)
    assert clipped.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]


def test_gradient_is_cut_where_clipped() -> None:
    logp = torch.tensor([0.5, -0.5], requires_grad=True)
    loss, _ = clipped_policy_loss(logp, torch.zeros(2), torch.tensor([1.0, 1.0]), 0.2)
    loss.sum().backward()
    assert logp.grad is not None
    # first token clipped -> no gradient; second: d(-r)/dlogp = -r = -0.606531
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, -math.exp(-0.5)]), atol=1e-6, rtol=0)


def test_rejects_nonpositive_clip_ratio() -> None:
    with pytest.raises(ValueError, match="clip_ratio"):
        clipped_policy_loss(torch.zeros(1), torch.zeros(1), torch.ones(1), 0.0)
