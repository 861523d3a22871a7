import pytest
import torch

from mindspeed_rl.models.loss import group_norm_advantages


def test_group_norm_hand_computed() -> None:
    # group 1: [1, 2, 3] -> mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1 -> [-1, 0, 1]
    # group 2: [0, 0, 3] -> mean 1, deviations [-1, -1, 2], unbiased var (1 + 1 + 4) / 2 = 3
    #          -> [-1, -1, 2] / sqrt(3) = [-0.57735, -0.57735, 1.15470]
    rewards = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 3.0])
    adv = group_norm_advantages(rewards, 3)
    expected = torch.tensor([-1.0, 0.0, 1.0, -0.57735, -0.57735, 1.15470])
    torch.testing.assert_close(adv, expected, atol=1e-4, rtol=0)


def test_group_with_equal_rewards_gets_zero_advantage() -> None:
    adv = group_norm_advantages(torch.tensor([0.7, 0.7, 0.7, 0.0, 1.0, 0.5]), 3)
    assert torch.equal(adv[:3], torch.zeros(3))
    assert adv[3] < 0 < adv[4]


@pytest.mark.parametrize(("n", "size"), [(1, 4), (3, 4)])
def test_group_norm_rejects_bad_group_size(n: int, size: int) -> None:
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        group_norm_advantages(torch.zeros(size), n)
