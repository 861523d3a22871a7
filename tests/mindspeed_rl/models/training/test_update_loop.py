"""The update loop both engines share, driven through fake hooks (no model): step order, learning
rate and clip threshold per step, metric averaging, counters, KL control, and the loss pieces."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from mindspeed_rl.models.loss.config import GRPOLossConfig
from mindspeed_rl.models.loss.kl_control import KLController, build_kl_controller
from mindspeed_rl.models.training.batch import TrainBatch, pad_batch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.hf_folder import copy_non_weight_files
from mindspeed_rl.models.training.lr_schedule import LRSchedule
from mindspeed_rl.models.training.update_loop import (
    LOSS_TERMS,
    LossSums,
    MiniBatchLoss,
    loss_term_values,
    progress_state,
    restore_progress,
    run_update,
)


@dataclass
class _State:
    config: TorchEngineConfig
    kl_controller: KLController
    num_optimizer_steps: int = 0
    num_updates: int = 0


@dataclass
class _Hooks:
    """Records every call; each mini-batch's 'loss' is its first advantage, its 'kl' 0.5."""

    calls: list[tuple[str, object]] = field(default_factory=list)
    last_lr: float = float("nan")

    def zero_grad(self) -> None:
        self.calls.append(("zero_grad", None))

    def forward_backward(self, loss: MiniBatchLoss) -> dict[str, float]:
        self.calls.append(("forward_backward", (loss.mini.num_samples, loss.kl_coef, loss.temperature)))
        totals = dict.fromkeys(LOSS_TERMS, 0.0)
        totals["loss"] = float(loss.mini.advantages[0])
        totals["kl"] = 0.5
        return totals

    def apply_gradients(self, *, lr: float, max_norm: float) -> float:
        self.calls.append(("apply_gradients", (lr, max_norm)))
        self.last_lr = lr
        return 2.0 * len([c for c in self.calls if c[0] == "apply_gradients"])

    @property
    def lr(self) -> float:
        return self.last_lr


def _batch(num_samples: int = 4, with_old: bool = True) -> TrainBatch:
    rng = np.random.default_rng(0)
    responses = [rng.integers(4, 50, size=int(rng.integers(1, 6))) for _ in range(num_samples)]
    return TrainBatch.from_lists(
        prompt_ids=[[1, 2, 3]] * num_samples,
        response_ids=responses,
        advantages=np.arange(num_samples, dtype=np.float32),
        old_log_probs=[np.full(r.size, -1.0) for r in responses] if with_old else None,
        ref_log_probs=[np.full(r.size, -1.1) for r in responses],
    )


def _config(**overrides: object) -> TorchEngineConfig:
    base: dict[str, object] = dict(
        lr=1e-2, clip_grad=0.0, mini_batch_size=1, n_samples_per_prompt=2, epochs=2,
        loss=GRPOLossConfig(init_kl_coef=0.1, kl_ctrl_type="adaptive", kl_target=0.25, kl_horizon=8),
        lr_schedule=LRSchedule(lr=1e-2, warmup_steps=4),
    )  # fmt: skip
    base.update(overrides)
    return TorchEngineConfig(**base)  # type: ignore[arg-type]


def test_each_mini_batch_is_one_step_in_order_with_the_scheduled_lr() -> None:
    config = _config()
    state, hooks = _State(config, build_kl_controller(config.loss)), _Hooks()
    metrics = run_update(state, hooks, _batch(), temperature=0.7)
    # 4 samples / (1 prompt x 2) = 2 mini-batches, x 2 epochs = 4 steps.
    kinds = [kind for kind, _ in hooks.calls]
    assert kinds == ["zero_grad", "forward_backward", "apply_gradients"] * 4
    steps = [args for kind, args in hooks.calls if kind == "apply_gradients"]
    assert steps == [(config.schedule.lr_at(k), float("inf")) for k in (1, 2, 3, 4)]
    assert {args for kind, args in hooks.calls if kind == "forward_backward"} == {(2, 0.1, 0.7)}
    assert (state.num_optimizer_steps, state.num_updates) == (4, 1)
    assert metrics["num_optimizer_steps"] == 4.0
    assert metrics["lr"] == config.schedule.lr_at(4)
    assert metrics["grad_norm"] == np.mean([2.0, 4.0, 6.0, 8.0])
    # Unshuffled: the mini-batches start at samples 0 and 2 in both epochs.
    assert metrics["loss"] == np.mean([0.0, 2.0, 0.0, 2.0])
    assert metrics["kl_coef"] == 0.1
    # kl 0.5 is above the target 0.25: the adaptive controller raises the coefficient by 20% x 4/8.
    assert state.kl_controller.value == pytest.approx(0.1 * 1.1)


def test_a_second_update_continues_the_schedule_and_uses_the_new_kl_coefficient() -> None:
    config = _config(clip_grad=0.5, epochs=1)
    state, hooks = _State(config, build_kl_controller(config.loss)), _Hooks()
    run_update(state, hooks, _batch(), temperature=1.0)
    coef = state.kl_controller.value
    hooks.calls.clear()
    metrics = run_update(state, hooks, _batch(), temperature=1.0)
    steps = [args for kind, args in hooks.calls if kind == "apply_gradients"]
    assert steps == [(config.schedule.lr_at(3), 0.5), (config.schedule.lr_at(4), 0.5)]
    assert metrics["kl_coef"] == coef != 0.1
    assert state.num_updates == 2


def test_kl_outside_the_loss_leaves_the_controller_alone() -> None:
    loss = GRPOLossConfig(
        init_kl_coef=0.1, kl_ctrl_type="adaptive", kl_target=0.25, kl_horizon=8, use_kl_in_reward=True
    )
    config = _config(loss=loss)
    state = _State(config, build_kl_controller(loss))
    run_update(state, _Hooks(), _batch(), temperature=1.0)
    assert state.kl_controller.value == 0.1


def test_refused_batches_take_no_step() -> None:
    config = _config()
    state, hooks = _State(config, build_kl_controller(config.loss)), _Hooks()
    with pytest.raises(ValueError, match="do not split"):
        run_update(state, hooks, _batch(num_samples=3), temperature=1.0)
    with pytest.raises(ValueError, match="temperature"):
        run_update(state, hooks, _batch(), temperature=0.0)
    assert hooks.calls == [] and (state.num_optimizer_steps, state.num_updates) == (0, 0)


def test_progress_round_trips() -> None:
    config = _config()
    saved = _State(config, build_kl_controller(config.loss), num_optimizer_steps=7, num_updates=3)
    saved.kl_controller.value = 0.37
    fresh = _State(config, build_kl_controller(config.loss))
    restore_progress(fresh, progress_state(saved))
    assert (fresh.num_optimizer_steps, fresh.num_updates, fresh.kl_controller.value) == (7, 3, 0.37)


@pytest.mark.parametrize("token_level", [True, False])
def test_micro_batch_losses_sum_to_the_mini_batch_loss(token_level: bool) -> None:
    """The normalisation by the whole mini-batch's counts: any split into micro-batches sums to
    the loss of the mini-batch taken at once, and LossSums adds the terms as float64."""
    config = GRPOLossConfig(init_kl_coef=0.05, token_level_loss=token_level, entropy_coeff=0.01)
    mini = _batch(num_samples=5)
    loss = MiniBatchLoss(mini=mini, temperature=1.0, kl_coef=0.05, config=config)
    rng = np.random.default_rng(1)
    logps = [
        torch.from_numpy(rng.normal(-1.0, 0.6, size=r.size).astype(np.float32)) for r in mini.response_ids
    ]

    def terms_of(indices: list[int]) -> dict[str, torch.Tensor]:
        padded = pad_batch(mini.select(indices), pad_token_id=0)
        logp = torch.nn.utils.rnn.pad_sequence([logps[i] for i in indices], batch_first=True)
        return loss_term_values(loss(padded, logp, entropy=-logp))

    whole = terms_of([0, 1, 2, 3, 4])
    sums = LossSums("cpu")
    for part in ([0, 3], [1], [2, 4]):
        sums.add(terms_of(part))
    totals = sums.totals()
    for name in LOSS_TERMS:
        assert totals[name] == pytest.approx(float(whole[name]), rel=1e-6, abs=1e-7), name
    assert totals["clip_frac"] > 0  # old log-probs of -1 against these: some ratios are clipped


def test_without_old_log_probs_the_ratio_is_one() -> None:
    mini = _batch(num_samples=2, with_old=False)
    loss = MiniBatchLoss(mini=mini, temperature=1.0, kl_coef=0.0, config=GRPOLossConfig(init_kl_coef=0.0))
    padded = pad_batch(mini, pad_token_id=0)
    logp = torch.full(padded.response_mask.shape, -2.0)
    terms = loss(padded, logp, entropy=None)
    assert float(terms.clip_frac) == 0.0
    # ratio 1: the policy loss is -mean(advantage) over the response tokens.
    lengths = np.array([r.size for r in mini.response_ids])
    assert float(terms.pg_loss) == pytest.approx(-(mini.advantages * lengths).sum() / lengths.sum())


def test_non_weight_files_are_copied_once_and_never_onto_themselves(tmp_path: Path) -> None:
    source, target = tmp_path / "src", tmp_path / "dst"
    source.mkdir()
    target.mkdir()
    for name in ("config.json", "tokenizer.model", "chat_template.jinja", "model.safetensors.index.json"):
        (source / name).write_text(name)
    (source / "model.safetensors").write_text("weights")
    (target / "config.json").write_text("written by the engine")
    copy_non_weight_files(source, target)
    assert sorted(p.name for p in target.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "tokenizer.model",
    ]
    assert (target / "config.json").read_text() == "written by the engine"
    copy_non_weight_files(source, source)
    assert len(list(source.iterdir())) == 5
