"""The torch engine's part of a checkpoint: continuing from ``save_state`` gives exactly the next
update that not stopping gives (weights, AdamW moments, bf16 masters, LR step, KL coefficient,
mini-batch shuffle, RNG)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from mindspeed_rl.models.loss import GRPOLossConfig
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.lr_schedule import LRSchedule
from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine
from mindspeed_rl.models.training.trainer_state import TRAINER_STATE_FILE


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY_TEST_ARCH, seed=0)


def _batch(seed: int) -> TrainBatch:
    rng = np.random.default_rng(seed)
    prompts, responses = [], []
    for _ in range(4):
        prompt = rng.integers(4, 100, size=4).tolist()
        for _ in range(2):
            prompts.append(prompt)
            responses.append(rng.integers(4, 100, size=int(rng.integers(1, 9))).tolist())
    return TrainBatch.from_lists(prompt_ids=prompts, response_ids=responses, advantages=rng.normal(size=8))


def _engine(path: Path, dtype: str) -> TorchTrainingEngine:
    config = TorchEngineConfig(
        lr=1e-2,
        lr_schedule=LRSchedule(lr=1e-2, decay_style="cosine", warmup_steps=2, decay_steps=12),
        clip_grad=0.0,
        micro_batch_size=4,
        forward_micro_batch_size=4,
        mini_batch_size=2,  # 2 optimizer steps per update, shuffled
        shuffle_mini_batch=True,
        n_samples_per_prompt=2,
        loss=GRPOLossConfig(init_kl_coef=0.0),
        param_dtype=dtype,
        seed=3,
    )
    return TorchTrainingEngine(path, config)


def _update(engine: TorchTrainingEngine, seed: int) -> dict[str, float]:
    batch = _batch(seed)
    return engine.update(batch.with_log_probs(old=engine.compute_log_probs(batch, 1.0)), 1.0)


def _weights(engine: TorchTrainingEngine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_resumed_engine_takes_the_same_next_update(model_path: Path, tmp_path: Path, dtype: str) -> None:
    straight = _engine(model_path, dtype)
    _update(straight, 0)
    straight.kl_controller.value = 0.37  # as an adaptive controller would have moved it
    straight.save_state(tmp_path / "ckpt")
    draws = (torch.rand(3), np.random.rand(3), random.random())
    expected = _update(straight, 1)

    resumed = _engine(model_path, dtype)  # fresh process: initial weights, step 0
    resumed.load_state(tmp_path / "ckpt")
    assert (resumed.num_optimizer_steps, resumed.kl_coef) == (2, 0.37)
    assert torch.equal(draws[0], torch.rand(3)) and np.array_equal(draws[1], np.random.rand(3))
    assert draws[2] == random.random()
    got = _update(resumed, 1)
    assert got["lr"] == expected["lr"] and got["loss"] == expected["loss"]
    for name, tensor in _weights(straight).items():
        assert torch.equal(tensor, _weights(resumed)[name]), name


def test_no_load_optim_starts_fresh_moments_and_a_missing_state_is_named(
    model_path: Path, tmp_path: Path
) -> None:
    straight = _engine(model_path, "float32")
    _update(straight, 0)
    straight.save_state(tmp_path / "full")
    straight.save_state(tmp_path / "lean", optimizer=False, rng=False)
    _update(straight, 1)

    fresh_moments = _engine(model_path, "float32")
    fresh_moments.load_state(tmp_path / "full", optimizer=False)
    _update(fresh_moments, 1)
    differs = any(
        not torch.equal(a, b) for a, b in zip(_weights(straight).values(), _weights(fresh_moments).values())
    )
    assert differs  # the optimizer state matters, so the round trip above is a real check

    lean = _engine(model_path, "float32")
    with pytest.raises(ValueError, match="no_load_optim: true"):
        lean.load_state(tmp_path / "lean")
    with pytest.raises(ValueError, match="no_load_rng: true"):
        lean.load_state(tmp_path / "lean", optimizer=False)
    lean.load_state(tmp_path / "lean", optimizer=False, rng=False)
    assert lean.num_optimizer_steps == 2
    assert (tmp_path / "lean" / "config.json").is_file() and (
        tmp_path / "lean" / TRAINER_STATE_FILE
    ).is_file()
