"""The engine's carried state: LR schedule per optimizer step, adaptive KL coefficient; and the
loss keys (clip-higher, sequence-level loss) reaching the update."""

from pathlib import Path

import numpy as np
import pytest

from mindspeed_rl.models.loss import GRPOLossConfig
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.lr_schedule import LRSchedule
from mindspeed_rl.models.training.reference import ReferenceModel
from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

NO_KL = GRPOLossConfig(init_kl_coef=0.0)


def _batch(num_prompts: int, seed: int = 0) -> TrainBatch:
    rng = np.random.default_rng(seed)
    prompts, responses = [], []
    for _ in range(num_prompts):
        prompt = rng.integers(4, 100, size=4).tolist()
        for _ in range(2):
            prompts.append(prompt)
            responses.append(rng.integers(4, 100, size=int(rng.integers(1, 9))).tolist())
    return TrainBatch.from_lists(
        prompt_ids=prompts, response_ids=responses, advantages=rng.normal(size=len(prompts))
    )


def _engine(path: Path, **overrides: object) -> TorchTrainingEngine:
    base: dict[str, object] = dict(lr=1e-3, clip_grad=0.0, micro_batch_size=4, forward_micro_batch_size=4,
                                   mini_batch_size=1, n_samples_per_prompt=2, loss=NO_KL, seed=3)  # fmt: skip
    base.update(overrides)
    return TorchTrainingEngine(path, TorchEngineConfig(**base))  # type: ignore[arg-type]


def test_lr_schedule_sets_every_optimizer_step(tiny_model_path: Path) -> None:
    schedule = LRSchedule(lr=1e-3, decay_style="cosine", warmup_steps=2, decay_steps=6)
    engine = _engine(tiny_model_path, lr_schedule=schedule)
    batch = _batch(num_prompts=2)  # 2 optimizer steps per update
    seen = []
    for _ in range(3):
        metrics = engine.update(batch.with_log_probs(old=engine.compute_log_probs(batch, 1.0)), 1.0)
        seen.append(metrics["lr"])
    assert seen == pytest.approx([schedule.lr_at(2), schedule.lr_at(4), schedule.lr_at(6)])
    assert seen[0] == 1e-3 and seen[2] == 0.0  # peak after warm-up, min_lr at the end


def test_clip_higher_reaches_the_update(tiny_model_path: Path) -> None:
    batch = _batch(num_prompts=2, seed=1)
    fracs = []
    for loss in (NO_KL, GRPOLossConfig(init_kl_coef=0.0, clip_ratio_low=0.2, clip_ratio_high=0.28)):
        engine = _engine(tiny_model_path, mini_batch_size=2, loss=loss)
        current = engine.compute_log_probs(batch, 1.0)
        # Behaviour log-probs 0.22 below the current ones: every ratio is e^0.22 = 1.25.
        old = [lp - 0.22 for lp in current]
        positive = TrainBatch.from_lists(prompt_ids=batch.prompt_ids, response_ids=batch.response_ids,
                                         advantages=np.ones(batch.num_samples), old_log_probs=old)  # fmt: skip
        fracs.append(engine.update(positive, 1.0)["clip_frac"])
    assert fracs[0] == pytest.approx(1.0, abs=1e-4) and fracs[1] == pytest.approx(0.0, abs=1e-4)


def test_sequence_level_loss_reaches_the_update(tiny_model_path: Path) -> None:
    batch = _batch(num_prompts=2, seed=2)
    pg = []
    for token_level in (True, False):
        engine = _engine(tiny_model_path, mini_batch_size=2, micro_batch_size=1,
                         loss=GRPOLossConfig(init_kl_coef=0.0, token_level_loss=token_level))  # fmt: skip
        pg.append(engine.update(batch, 1.0)["pg_loss"])
    lengths = np.array([r.size for r in batch.response_ids])
    assert pg[0] == pytest.approx(-(batch.advantages * lengths).sum() / lengths.sum(), abs=1e-5)
    assert pg[1] == pytest.approx(-batch.advantages.mean(), abs=1e-5)  # ratio 1: -mean over sequences


def test_adaptive_kl_coefficient_is_carried_and_logged(tiny_model_path: Path) -> None:
    loss = GRPOLossConfig(
        init_kl_coef=0.1, kl_penalty="mse", kl_ctrl_type="adaptive", kl_target=1e-12, kl_horizon=4
    )
    engine = _engine(tiny_model_path, lr=1e-2, mini_batch_size=2, loss=loss)  # one step per update
    ref = ReferenceModel(tiny_model_path, micro_batch_size=4)
    batch = _batch(num_prompts=2)
    coefs = []
    for _ in range(3):
        full = batch.with_log_probs(
            old=engine.compute_log_probs(batch, 1.0), ref=ref.compute_log_probs(batch, 1.0)
        )
        coefs.append(engine.update(full, 1.0)["kl_coef"])
    # First update starts at the reference (kl 0 < target): coef shrinks by 20% x 4/4; later the
    # policy has moved (kl >> target): it grows by 20% each time.
    assert coefs[0] == pytest.approx(0.1)
    assert coefs[1] == pytest.approx(0.1 * 0.8)
    assert coefs[2] == pytest.approx(0.1 * 0.8 * 1.2)
    assert engine.kl_coef == pytest.approx(0.1 * 0.8 * 1.2 * 1.2)
