"""The off-policy correction through the torch engine's update: the default keeps today's update
bit for bit (weights and loss), a correction changes it, and the ``rollout_corr/*`` metrics come out
per lag."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from mindspeed_rl.models.loss import GRPOLossConfig
from mindspeed_rl.models.loss.correction_config import RolloutCorrectionConfig
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

LOSS = GRPOLossConfig(init_kl_coef=0.0)


def _config(loss: GRPOLossConfig = LOSS) -> TorchEngineConfig:
    return TorchEngineConfig(
        lr=1e-2, clip_grad=0.0, micro_batch_size=3, forward_micro_batch_size=4,
        mini_batch_size=2, n_samples_per_prompt=2, loss=loss, seed=3,
    )  # fmt: skip


def _batch(engine: TorchTrainingEngine, *, rollout: bool, noise: float = 0.0) -> TrainBatch:
    rng = np.random.default_rng(0)
    prompts, responses = [], []
    for _ in range(4):
        prompt = rng.integers(4, 100, size=int(rng.integers(2, 7))).tolist()
        for _ in range(2):
            prompts.append(prompt)
            responses.append(rng.integers(4, 100, size=int(rng.integers(1, 9))).tolist())
    batch = TrainBatch.from_lists(prompt_ids=prompts, response_ids=responses, advantages=rng.normal(size=8))
    current = engine.compute_log_probs(batch, 1.0)
    behave = (
        [c + rng.normal(scale=noise, size=c.shape).astype(np.float32) for c in current] if noise else current
    )
    batch = batch.with_log_probs(old=behave)
    if not rollout:
        return batch
    # Samples of versions 0 and 1; the lag is the engine's version (its update count) minus these.
    return dataclasses.replace(
        batch,
        rollout_log_probs=tuple(behave),
        versions=tuple(np.full(r.shape, i % 2, dtype=np.int64) for i, r in enumerate(batch.response_ids)),
    )


def _weights(engine: TorchTrainingEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.model.state_dict().items()}


def test_default_and_all_null_bypass_keep_the_update_bit_identical(tiny_model_path: Path) -> None:
    plain = TorchTrainingEngine(tiny_model_path, _config())
    m_plain = plain.update(_batch(plain, rollout=False, noise=0.1), 1.0)
    for correction in (None, RolloutCorrectionConfig(mode="bypass")):
        engine = TorchTrainingEngine(
            tiny_model_path, _config(dataclasses.replace(LOSS, rollout_correction=correction))
        )
        metrics = engine.update(_batch(engine, rollout=True, noise=0.1), 1.0)
        assert metrics["loss"] == m_plain["loss"] and metrics["grad_norm"] == m_plain["grad_norm"]
        for name, tensor in _weights(engine).items():
            assert torch.equal(tensor, _weights(plain)[name]), name
        assert metrics["rollout_corr/is_weight_max"] > 1.0  # the behaviour log-probs differ
        assert (
            "rollout_corr/lag_0/is_weight_mean" in metrics
        )  # trainer version 0, sample versions 0/1 -> lag 0


def test_decoupled_tis_changes_the_update_and_reports_per_lag(tiny_model_path: Path) -> None:
    correction = RolloutCorrectionConfig(
        mode="decoupled", prox_logp="loglinear", rollout_is="token", is_upper=1.05
    )
    plain = TorchTrainingEngine(tiny_model_path, _config())
    engine = TorchTrainingEngine(
        tiny_model_path, _config(dataclasses.replace(LOSS, rollout_correction=correction))
    )
    for e in (plain, engine):
        e.num_updates = 2  # the trainer is at version 2: samples of versions 0 and 1 are 2 and 1 stale
    m_plain = plain.update(_batch(plain, rollout=True, noise=0.3), 1.0)
    metrics = engine.update(_batch(engine, rollout=True, noise=0.3), 1.0)
    assert metrics["loss"] != m_plain["loss"]
    assert metrics["rollout_corr/is_clipped_frac"] > 0
    assert {"rollout_corr/lag_1/is_weight_mean", "rollout_corr/lag_2/is_weight_mean"} <= set(metrics)
    assert "rollout_corr/lag_0/is_weight_mean" not in metrics
