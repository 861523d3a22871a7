from pathlib import Path

import numpy as np
import pytest
import torch

from mindspeed_rl.models.loss import GRPOLossConfig
from mindspeed_rl.models.training.base import TrainingEngine
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.reference import ReferenceModel
from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

NO_KL = GRPOLossConfig(init_kl_coef=0.0)


def _config(**overrides: object) -> TorchEngineConfig:
    base: dict[str, object] = dict(
        lr=1e-3, clip_grad=0.0, micro_batch_size=4, forward_micro_batch_size=2,
        mini_batch_size=2, n_samples_per_prompt=2, loss=NO_KL, seed=3,
    )  # fmt: skip
    base.update(overrides)
    return TorchEngineConfig(**base)  # type: ignore[arg-type]


def _batch(num_prompts: int = 2, n: int = 2, seed: int = 0) -> TrainBatch:
    rng = np.random.default_rng(seed)
    prompts, responses = [], []
    for _ in range(num_prompts):
        prompt = rng.integers(4, 100, size=int(rng.integers(2, 7))).tolist()
        for _ in range(n):
            prompts.append(prompt)
            responses.append(rng.integers(4, 100, size=int(rng.integers(1, 9))).tolist())
    adv = rng.normal(size=len(prompts))
    return TrainBatch.from_lists(prompt_ids=prompts, response_ids=responses, advantages=adv)


def test_engine_satisfies_protocol(tiny_model_path: Path) -> None:
    assert isinstance(TorchTrainingEngine(tiny_model_path, _config()), TrainingEngine)


def test_log_probs_match_manual_forward(tiny_model_path: Path) -> None:
    engine = TorchTrainingEngine(tiny_model_path, _config())
    batch, temperature = _batch(num_prompts=3), 0.7
    got = engine.compute_log_probs(batch, temperature)
    with torch.no_grad():
        for i in range(batch.num_samples):
            p, r = batch.prompt_ids[i], batch.response_ids[i]
            ids = torch.tensor(np.concatenate([p, r]))[None]
            logits = engine.model(input_ids=ids).logits[0]  # unpadded, one sequence at a time
            logp = torch.log_softmax(logits / temperature, dim=-1)
            positions = torch.arange(p.size - 1, p.size - 1 + r.size)
            want = logp[positions, torch.from_numpy(r)].numpy()
            np.testing.assert_allclose(got[i], want, atol=1e-5)


def test_positive_advantage_raises_sampled_log_prob(tiny_model_path: Path) -> None:
    engine = TorchTrainingEngine(tiny_model_path, _config(lr=1e-2, mini_batch_size=1))
    batch = TrainBatch.from_lists(
        prompt_ids=[[10, 11, 12], [10, 11, 12]], response_ids=[[40, 41, 42], [50, 51]], advantages=[1.0, -1.0]
    )
    before = engine.compute_log_probs(batch, 1.0)
    engine.update(batch.with_log_probs(old=before), 1.0)
    after = engine.compute_log_probs(batch, 1.0)
    assert after[0].sum() > before[0].sum()
    assert after[1].sum() < before[1].sum()


def test_gradient_accumulation_matches_one_big_micro_batch(tiny_model_path: Path) -> None:
    batch = _batch(num_prompts=2, n=2)
    grads = []
    for micro in (1, 3, 4):  # 3 leaves an uneven last micro-batch
        engine = TorchTrainingEngine(tiny_model_path, _config(micro_batch_size=micro))
        engine.update(batch.with_log_probs(old=engine.compute_log_probs(batch, 1.0)), 1.0)
        grads.append({n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None})
    for other in grads[1:]:
        assert other.keys() == grads[0].keys()
        for name, g in grads[0].items():
            torch.testing.assert_close(other[name], g, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("mini", "epochs", "expected"), [(1, 1, 4), (2, 3, 6), (4, 2, 2)])
def test_optimizer_step_count(tiny_model_path: Path, mini: int, epochs: int, expected: int) -> None:
    engine = TorchTrainingEngine(
        tiny_model_path, _config(mini_batch_size=mini, epochs=epochs, shuffle_mini_batch=True)
    )
    batch = _batch(num_prompts=4, n=2)
    metrics = engine.update(batch.with_log_probs(old=engine.compute_log_probs(batch, 1.0)), 1.0)
    assert metrics["num_optimizer_steps"] == expected == engine.num_optimizer_steps
    assert set(metrics) >= {"loss", "pg_loss", "kl", "entropy", "clip_frac", "grad_norm", "lr"}


def test_ratio_is_one_when_old_equals_current(tiny_model_path: Path) -> None:
    engine = TorchTrainingEngine(tiny_model_path, _config(mini_batch_size=2))
    batch = _batch(num_prompts=2, n=2)
    metrics = engine.update(batch.with_log_probs(old=engine.compute_log_probs(batch, 1.0)), 1.0)
    # ratio == 1 everywhere -> nothing clipped and pg_loss = -(token-weighted mean advantage)
    lengths = np.array([r.size for r in batch.response_ids])
    assert metrics["clip_frac"] == 0.0
    assert metrics["pg_loss"] == pytest.approx(-(batch.advantages * lengths).sum() / lengths.sum(), abs=1e-5)


def test_update_is_deterministic_with_seed(tiny_model_path: Path) -> None:
    batch = _batch(num_prompts=4, n=2, seed=5)
    states = []
    for _ in range(2):
        engine = TorchTrainingEngine(tiny_model_path, _config(mini_batch_size=1, shuffle_mini_batch=True))
        engine.update(batch.with_log_probs(old=engine.compute_log_probs(batch, 1.0)), 1.0)
        states.append(dict(engine.named_weights_for_inference()))
    for name, tensor in states[0].items():
        assert torch.equal(tensor, states[1][name]), name


def test_kl_against_frozen_reference(tiny_model_path: Path) -> None:
    cfg = _config(lr=1e-2, mini_batch_size=1, loss=GRPOLossConfig(kl_penalty="low_var_kl", init_kl_coef=0.1))
    engine = TorchTrainingEngine(tiny_model_path, cfg)
    ref = ReferenceModel(tiny_model_path, micro_batch_size=3)
    batch = _batch(num_prompts=2, n=2)
    ref_lp = ref.compute_log_probs(batch, 1.0)
    for a, b in zip(ref_lp, engine.compute_log_probs(batch, 1.0)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    full = batch.with_log_probs(old=engine.compute_log_probs(batch, 1.0), ref=ref_lp)
    first = engine.update(full, 1.0)
    second = engine.update(full, 1.0)
    assert first["kl"] < second["kl"]  # the first mini-batch starts at the reference: KL exactly 0
    for a, b in zip(ref_lp, ref.compute_log_probs(batch, 1.0)):
        np.testing.assert_array_equal(a, b)


def test_save_hf_round_trip(tiny_model_path: Path, tmp_path: Path) -> None:
    engine = TorchTrainingEngine(tiny_model_path, _config(lr=1e-2, mini_batch_size=4))
    batch = _batch(num_prompts=4, n=2)
    engine.update(batch, 1.0)
    engine.save_hf(tmp_path / "out")
    assert (tmp_path / "out" / "tokenizer.json").exists()
    names = {n for n, _ in engine.named_weights_for_inference()}
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names
    reloaded = ReferenceModel(tmp_path / "out", micro_batch_size=8)
    for a, b in zip(reloaded.compute_log_probs(batch, 1.0), engine.compute_log_probs(batch, 1.0)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_update_rejects_bad_batches(tiny_model_path: Path) -> None:
    engine = TorchTrainingEngine(tiny_model_path, _config(mini_batch_size=1))
    with pytest.raises(ValueError, match="mini_batch_size"):
        engine.update(_batch(num_prompts=3, n=1), 1.0)
    with pytest.raises(ValueError, match="old_log_probs"):
        engine.update(_batch(num_prompts=2, n=2), 1.0)
    with pytest.raises(ValueError, match="empty"):
        TrainBatch.from_lists(prompt_ids=[[1]], response_ids=[[]], advantages=[0.0])
