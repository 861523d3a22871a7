"""bf16 parameters with fp32 masters: the optimizer step, the engine on CPU, and what it exports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open

from mindspeed_rl.models.loss import GRPOLossConfig
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.precision import (
    AdamWSettings,
    FullPrecisionOptimizer,
    MasterWeightOptimizer,
    build_optimizer,
)
from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

SETTINGS = AdamWSettings(lr=1e-3, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-8)


def test_updates_below_a_bf16_ulp_accumulate_in_the_fp32_master() -> None:
    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = MasterWeightOptimizer([weight], SETTINGS)
    for _ in range(40):  # each Adam step moves the weight by ~lr = 1e-3, a quarter of bf16's ulp at 1.0
        weight.grad = torch.ones(4, dtype=torch.bfloat16)
        opt.after_backward()
        opt.clip_grad_norm(float("inf"))
        opt.step(1e-3)
        opt.zero_grad()
    assert opt.masters[0].dtype == torch.float32 and weight.dtype == torch.bfloat16
    assert opt.masters[0][0].item() == pytest.approx(1 - 40e-3, abs=1e-4)
    assert weight[0].item() == pytest.approx(1 - 40e-3, abs=4e-3)  # the rounded copy moved too
    state = opt._optimizer.state[opt.masters[0]]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32


def test_micro_batch_gradients_are_summed_in_fp32() -> None:
    weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))
    opt = MasterWeightOptimizer([weight], SETTINGS)
    for _ in range(300):  # 256 + 1 + 1 ... is 256 in bf16 (8 mantissa bits), 300 in fp32
        weight.grad = torch.ones(1, dtype=torch.bfloat16)
        opt.after_backward()
        assert weight.grad is None
    assert opt.masters[0].grad is not None and opt.masters[0].grad.item() == 300.0


def test_build_optimizer_picks_by_parameter_dtype() -> None:
    assert isinstance(
        build_optimizer(torch.nn.Linear(2, 2).to(torch.bfloat16), SETTINGS), MasterWeightOptimizer
    )
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        build_optimizer(torch.nn.Linear(2, 2).to(torch.float16), SETTINGS)


def _batch() -> TrainBatch:
    rng = np.random.default_rng(0)
    prompts = [rng.integers(4, 100, size=4).tolist() for _ in range(4)]
    responses = [rng.integers(4, 100, size=6).tolist() for _ in range(4)]
    return TrainBatch.from_lists(
        prompt_ids=prompts, response_ids=responses, advantages=[1.0, -1.0, 0.5, -0.5]
    )


def _engine(path: Path, **overrides: object) -> TorchTrainingEngine:
    config: dict[str, object] = dict(
        lr=1e-2, micro_batch_size=2, mini_batch_size=2, n_samples_per_prompt=2,
        loss=GRPOLossConfig(init_kl_coef=0.0), param_dtype="bfloat16",
    )  # fmt: skip
    config.update(overrides)
    return TorchTrainingEngine(path, TorchEngineConfig(**config))  # type: ignore[arg-type]


def test_bf16_engine_on_cpu_trains_bf16_params_and_exports_the_rollout_dtype(tiny_model_path: Path) -> None:
    engine = _engine(tiny_model_path)
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    before = {n: t.float().clone() for n, t in engine.named_weights_for_inference()}
    batch = _batch()
    old = engine.compute_log_probs(batch, 1.0)
    metrics = engine.update(batch.with_log_probs(old=old), 1.0)
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    after = dict(engine.named_weights_for_inference())
    assert {t.dtype for t in after.values()} == {torch.bfloat16}
    assert any(not torch.equal(before[n], after[n].float()) for n in before)
    fp32 = dict(_engine(tiny_model_path, export_dtype="float32").named_weights_for_inference())
    assert {t.dtype for t in fp32.values()} == {torch.float32}


def test_bf16_save_hf_writes_a_bf16_folder(tiny_model_path: Path, tmp_path: Path) -> None:
    _engine(tiny_model_path).save_hf(tmp_path / "out")
    with safe_open(str(tmp_path / "out" / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118 (safe_open is not iterable)
    reloaded = _engine(tmp_path / "out", param_dtype="float32")  # a bf16 folder loads into fp32 too
    assert {p.dtype for p in reloaded.model.parameters()} == {torch.float32}


def test_bf16_snapshot_is_bf16_on_disk(tiny_model_path: Path, tmp_path: Path) -> None:
    from mindspeed_rl.weights.export import SnapshotWriter
    from mindspeed_rl.weights.layout import TrainingLayout
    from mindspeed_rl.weights.manifest import SnapshotManifest

    writer = SnapshotWriter(tmp_path / "snapshots", keep_last=2)
    engine = _engine(tiny_model_path, export_dtype="bfloat16")
    result = writer.export(1, engine.named_weights_for_inference(), TrainingLayout()).result()
    writer.close()
    assert result.published is not None
    manifest = SnapshotManifest.load(result.published.path)
    assert {t.dtype for t in manifest.tensors} == {"bfloat16"}
    (shard,) = result.published.path.glob("*.safetensors")
    with safe_open(str(shard), framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118 (safe_open is not iterable)


@pytest.mark.slow
def test_bf16_engine_follows_the_fp32_run_where_bf16_only_adamw_stalls(
    bf16_parity_model: Path, check_bf16_trajectories: Any
) -> None:
    """20 steps at lr 1e-5: each step is far below half a bf16 ulp of most weights, so AdamW on the
    bf16 weights themselves leaves them as they were; the fp32 masters take the steps."""
    steps, lr = 20, 1e-5
    rng = np.random.default_rng(0)
    batch = TrainBatch.from_lists(
        prompt_ids=[rng.integers(1, 100, size=5).tolist() for _ in range(4)],
        response_ids=[rng.integers(1, 100, size=7).tolist() for _ in range(4)],
        advantages=[1.0, -1.0, 0.5, -0.5],
    )
    runs: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for run in ("float32", "bfloat16", "bf16_only"):
        engine = _engine(
            bf16_parity_model, lr=lr, weight_decay=0.01, mini_batch_size=4, n_samples_per_prompt=1,
            param_dtype="float32" if run == "float32" else "bfloat16",
        )  # fmt: skip
        named = [(n, p) for n, p in engine.model.named_parameters() if p.requires_grad]
        if run == "bf16_only":
            engine.optimizer = FullPrecisionOptimizer(
                [p for _, p in named], AdamWSettings(lr=lr, weight_decay=0.01, betas=(0.9, 0.95), eps=1e-8)
            )
        start = {n: p.detach().float().clone() for n, p in named}
        for _ in range(steps):
            engine.update(batch, 1.0)
        masters = engine.optimizer.master_params or []
        runs[run] = {
            "start": start,
            "weights": {n: p.detach().clone() for n, p in named},
            "masters": {n: m.detach().clone() for (n, _), m in zip(named, masters, strict=False)},
        }
    check_bf16_trajectories(
        start=runs["float32"]["start"],
        fp32=runs["float32"]["weights"],
        masters=runs["bfloat16"]["masters"],
        bf16=runs["bfloat16"]["weights"],
        bf16_only=runs["bf16_only"]["weights"],
        steps=steps,
        lr=lr,
    )
