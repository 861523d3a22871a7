import numpy as np
import torch

from mindspeed_rl.models.loss.rollout_correction import loglinear_alpha
from mindspeed_rl.runtime.segments import TokenSegment, token_versions


def test_loglinear_alpha_uses_per_token_versions() -> None:
    # Trainer at v_prox = 5; tokens 0-1 from v3 (lag 2), tokens 2-3 from v5 (lag 0); step k/K = 1/2.
    segs = (TokenSegment(version=3, num_tokens=2), TokenSegment(version=5, num_tokens=2))
    versions = torch.tensor(np.array([token_versions(segs)]))
    alpha = loglinear_alpha(torch.clamp(5 - versions, min=0), 0.5)
    # alpha = lag / (lag + k/K): 2 / 2.5 = 0.8 for the old tokens, 0 / 0.5 = 0 for the new ones.
    assert torch.allclose(alpha, torch.tensor([[0.8, 0.8, 0.0, 0.0]]))
