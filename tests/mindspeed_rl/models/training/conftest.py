from pathlib import Path
from typing import Any

import pytest
import torch

from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY_TEST_ARCH, seed=0)


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at ``x`` (8 significant bits)."""
    return torch.pow(2.0, torch.floor(torch.log2(x.abs().clamp_min(2.0**-126))) - 7)


def _check_bf16_trajectories(
    *,
    start: dict[str, torch.Tensor],
    fp32: dict[str, torch.Tensor],
    masters: dict[str, torch.Tensor],
    bf16: dict[str, torch.Tensor],
    bf16_only: dict[str, torch.Tensor],
    steps: int,
    lr: float,
) -> None:
    """Three runs of ``steps`` AdamW steps at ``lr`` from the same bf16-representable weights:
    fp32 weights, bf16 weights with fp32 ``masters``, and ``bf16_only`` (AdamW on bf16 weights).

    "Large" weights are those whose bf16 half-ulp exceeds everything the run can move them
    (``steps x lr``, an Adam step being about lr): bf16-only steps must leave every one of them
    where it was (each update rounds away), the masters must move nearly all of them, the bf16
    weights must be the masters rounded, and the masters must agree with the fp32 run to within
    bf16 rounding (and move the same way: the cosine of the two displacements per tensor).
    """
    assert set(start) == set(fp32) == set(masters) == set(bf16) == set(bf16_only)
    large = total = moved = stuck = within = 0
    for name, w0 in start.items():
        big = bf16_ulp(w0) / 2 > 1.1 * steps * lr
        large += int(big.sum())
        moved += int(((masters[name] - w0) != 0)[big].sum())
        stuck += int((bf16_only[name].float() == w0)[big].sum())
        assert masters[name].dtype == torch.float32 and bf16[name].dtype == torch.bfloat16
        assert torch.equal(bf16[name], masters[name].to(torch.bfloat16)), name
        within += int(((masters[name] - fp32[name]).abs() <= bf16_ulp(fp32[name]) / 2).sum())
        total += w0.numel()
        cosine = torch.nn.functional.cosine_similarity(
            (masters[name] - w0).flatten(), (fp32[name] - w0).flatten(), dim=0
        )
        assert float(cosine) >= 0.95, (name, float(cosine))
    assert large > 1000, large
    assert stuck == large, f"bf16-only AdamW moved {large - stuck} of {large} large weights"
    assert moved >= 0.99 * large, f"the fp32 masters moved only {moved} of {large} large weights"
    assert within >= 0.98 * total, f"{within} of {total} weights within bf16 rounding of the fp32 run"


@pytest.fixture
def check_bf16_trajectories() -> Any:
    return _check_bf16_trajectories


@pytest.fixture
def bf16_parity_model(tmp_path: Path) -> Path:
    """A parity model (weights N(0, 0.15): most of them large for a bf16 ulp) whose weights are
    bf16 numbers stored in fp32, so fp32 and bf16 runs start from exactly the same weights."""
    from safetensors.torch import load_file, save_file

    from benchmarks.parity.models import build_parity_model

    path = build_parity_model(tmp_path / "qwen3", "qwen3")
    for file in path.glob("*.safetensors"):
        weights = {k: v.to(torch.bfloat16).float().contiguous() for k, v in load_file(str(file)).items()}
        save_file(weights, str(file), metadata={"format": "pt"})
    return path
