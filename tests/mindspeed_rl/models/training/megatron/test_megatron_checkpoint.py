"""The megatron engine's distributed checkpoint: resume at the same layout is exact, at another
layout it reshards (weights and AdamW moments); foreign or incomplete checkpoints are refused."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

HAVE_MEGATRON = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)
needs_megatron = pytest.mark.skipif(
    not HAVE_MEGATRON, reason="megatron-core not installed (make setup installs it)"
)

CASES = [
    # (family, tied, saved layout, loaded layout)
    ("qwen3", False, "tp2", "tp2"),
    ("qwen3", False, "tp2", "dp2"),
    ("qwen3_moe", False, "ep2", "dp2"),
    ("qwen2", True, "pp2", "tp2"),
]


@pytest.mark.integration
@needs_megatron
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("family", "tied", "saved", "loaded"), CASES, ids=[f"{c[0]}-{c[2]}-to-{c[3]}" for c in CASES]
)
def test_resume_continues_the_run(tmp_path: Path, family: str, tied: bool, saved: str, loaded: str) -> None:
    from benchmarks.parity.engine import build_parity_model
    from benchmarks.parity.resume import run_resume_case

    result = run_resume_case(build_parity_model(tmp_path / family, family, tied=tied), saved, loaded)
    if saved == loaded:
        assert result.resume_max_abs_diff == 0.0, result
        assert result.loss_abs_diff == 0.0, result
    else:  # the same sums in another order (TP-split matmuls, DP-split gradient sums)
        assert result.resume_max_abs_diff <= 1e-5, result
        assert result.loss_abs_diff <= 1e-6, result
    assert result.load_max_abs_diff == 0.0, result  # the load itself is exact at any layout
    files = set(result.checkpoint_files)
    assert {"config.json", "model.safetensors", "trainer_state.pt", "mcore_dist/.metadata"} <= files


@pytest.mark.integration
@needs_megatron
@pytest.mark.timeout(300)
def test_no_load_optim_restores_the_weights_with_fresh_moments(tmp_path: Path) -> None:
    from benchmarks.parity.engine import build_parity_model
    from benchmarks.parity.resume import run_resume_case

    model = build_parity_model(tmp_path / "qwen3", "qwen3")
    result = run_resume_case(model, "tp2", "tp2", load_optimizer=False)
    assert result.load_max_abs_diff == 0.0, result
    # Fresh moments change the next step (Adam's first step is ~lr * sign(g)): far from the
    # continued run's, unlike the 0.0 of a full resume.
    assert result.resume_max_abs_diff > 1e-4, result


class _Engine:
    def __init__(self, layout: dict[str, int]) -> None:
        self._layout = layout

    def layout_key(self) -> dict[str, int]:
        return self._layout


TP2 = {"tp": 2, "pp": 1, "ep": 1, "world_size": 2}
DP2 = {"tp": 1, "pp": 1, "ep": 1, "world_size": 2}


def _saved(**overrides: Any) -> dict[str, Any]:
    return {"optimizer": "mcore_dist", "rng": [{}, {}], "layout": TP2, **overrides}


@needs_megatron
@pytest.mark.parametrize(
    ("state", "opts", "message"),
    [
        (
            {"optimizer": {}, "rng": {}},
            {},
            "written by the torch engine; resume it with megatron_training.use_mcore_models: false",
        ),
        (_saved(optimizer=None), {}, "no_load_optim: true"),
        (_saved(rng=None), {}, "no_load_rng: true"),
        (_saved(layout=DP2), {}, "per-rank RNG states do not"),
    ],
    ids=["torch-checkpoint", "no-optimizer", "no-rng", "other-layout"],
)
def test_unloadable_checkpoints_name_the_fix(
    state: dict[str, Any], opts: dict[str, bool], message: str
) -> None:
    from mindspeed_rl.models.training.megatron.checkpoint import _check_loadable

    with pytest.raises(ValueError, match=message):
        _check_loadable(state, Path("/ck"), _Engine(TP2), optimizer=True, rng=True)  # type: ignore[arg-type]


@needs_megatron
def test_another_layout_loads_without_rng() -> None:
    from mindspeed_rl.models.training.megatron.checkpoint import _check_loadable

    _check_loadable(_saved(layout=DP2), Path("/ck"), _Engine(TP2), optimizer=True, rng=False)  # type: ignore[arg-type]


def test_torch_engine_refuses_a_megatron_checkpoint(tmp_path: Path, tiny_model_path: Path) -> None:
    from mindspeed_rl.models.training import trainer_state
    from mindspeed_rl.models.training.engine_config import TorchEngineConfig
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

    trainer_state.save_trainer_state(tmp_path, {"layout": TP2, "optimizer": "mcore_dist", "rng": None})
    engine = TorchTrainingEngine(tiny_model_path, TorchEngineConfig())
    with pytest.raises(ValueError, match="use_mcore_models: true"):
        engine.load_state(tmp_path)
