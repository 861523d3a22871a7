"""The GRPO update both training engines run, and the seams where the engines differ.

One ``update`` (:func:`run_update`)::

    for mini in mini_batches(batch):                         # one optimizer step each
        hooks.zero_grad()
        sums = hooks.forward_backward(MiniBatchLoss(mini))   # micro-batches -> backward -> grad sync
        grad_norm = hooks.apply_gradients(lr=schedule.lr_at(step), max_norm=clip_grad)
    metrics = mean over steps; kl_controller.update(mean kl)  # adaptive KL: next update's coefficient

Shared here: the order of an update, the learning-rate schedule and clip threshold, the loss of
one micro-batch from its log-probs (:class:`MiniBatchLoss`), the metric names and the state an
update advances (:class:`UpdateState`). An engine's own (:class:`StepHooks`): how its micro-batches
run (a python loop, or megatron's pipeline schedule), where the loss-term sums accumulate and over
which ranks they are reduced (:class:`LossSums` takes the device), how gradients are synchronised,
and the optimizer behind ``apply_gradients`` (plain AdamW, fp32 masters, a distributed optimizer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from mindspeed_rl.models.loss.grpo import GRPOLossTerms, grpo_loss
from mindspeed_rl.models.training.batch import PaddedBatch, TrainBatch, check_update_batch, mini_batches
from mindspeed_rl.models.training.log_probs import check_temperature

if TYPE_CHECKING:
    from mindspeed_rl.models.loss.config import GRPOLossConfig
    from mindspeed_rl.models.loss.kl_control import KLController
    from mindspeed_rl.models.training.engine_config import TorchEngineConfig

LOSS_TERMS = ("loss", "pg_loss", "kl", "entropy", "clip_frac")
STEP_METRICS = (*LOSS_TERMS, "grad_norm")


@dataclass(frozen=True, slots=True, kw_only=True)
class MiniBatchLoss:
    """The GRPO loss of any micro-batch of ``mini``, normalised by the whole mini-batch's token and
    sequence counts: summed over micro-batches (and over DP ranks) it is the mini-batch's loss."""

    mini: TrainBatch
    temperature: float
    kl_coef: float
    config: GRPOLossConfig

    @property
    def entropy_grad(self) -> bool:
        """Whether the entropy term reaches the gradient (otherwise it is only reported)."""
        return self.config.entropy_coeff > 0

    def __call__(
        self, padded: PaddedBatch, log_probs: torch.Tensor, entropy: torch.Tensor | None
    ) -> GRPOLossTerms:
        # Without old log-probs (one step only) the behaviour policy IS the current one: ratio == 1.
        old = padded.old_log_probs if padded.old_log_probs is not None else log_probs.detach()
        return grpo_loss(
            log_probs=log_probs,
            old_log_probs=old,
            advantages=padded.advantages,
            mask=padded.response_mask,
            config=self.config,
            num_tokens=self.mini.num_response_tokens,
            num_sequences=self.mini.num_samples,
            ref_log_probs=padded.ref_log_probs,
            entropy=entropy,
            kl_coef=self.kl_coef,
        )


def loss_term_values(terms: GRPOLossTerms) -> dict[str, torch.Tensor]:
    """The reported terms of one micro-batch, detached, by :data:`LOSS_TERMS` name."""
    return {name: getattr(terms, name).detach() for name in LOSS_TERMS}


class LossSums:
    """The loss terms summed over one optimizer step's micro-batches, as one float64 tensor on
    the device the engine chooses (host, or its accelerator to spare a sync per micro-batch)."""

    def __init__(self, device: torch.device | str) -> None:
        self.values = torch.zeros(len(LOSS_TERMS), dtype=torch.float64, device=device)

    def add(self, terms: Mapping[str, torch.Tensor]) -> None:
        """Add one micro-batch's terms (one-element tensors, on any device)."""
        device = self.values.device
        self.values += torch.stack([terms[name].reshape(()).to(device).double() for name in LOSS_TERMS])

    def all_reduce(self, group: Any = None) -> None:
        """Sum over ``group``'s ranks (each rank having added the micro-batches it scored)."""
        dist.all_reduce(self.values, group=group)

    def totals(self) -> dict[str, float]:
        return dict(zip(LOSS_TERMS, self.values.tolist(), strict=True))


class StepHooks(Protocol):
    """An engine's side of one optimizer step (what :func:`run_update` leaves to it)."""

    def zero_grad(self) -> None:
        """Clear what the previous step left in the gradient buffers."""
        ...

    def forward_backward(self, loss: MiniBatchLoss) -> dict[str, float]:
        """Forward and backward the micro-batches of ``loss.mini`` this rank runs, leaving the
        gradients synchronised for ``apply_gradients``; returns the :data:`LOSS_TERMS` totals of
        the whole mini-batch, the same on every rank."""
        ...

    def apply_gradients(self, *, lr: float, max_norm: float) -> float:
        """Clip the gradients to global norm ``max_norm`` and step the optimizer at ``lr``;
        returns the global norm before clipping."""
        ...

    @property
    def lr(self) -> float:
        """The learning rate of the latest step."""
        ...


class UpdateState(Protocol):
    """What outlives one update: its settings, the KL controller and the two counters (the step
    count drives the learning-rate schedule, the update count seeds the mini-batch shuffle)."""

    config: TorchEngineConfig
    kl_controller: KLController
    num_optimizer_steps: int
    num_updates: int


def run_update(
    state: UpdateState, hooks: StepHooks, batch: TrainBatch, temperature: float
) -> dict[str, float]:
    """One ``TrainingEngine.update``: every optimizer step of ``batch``, then the averaged metrics."""
    check_temperature(temperature)
    config = state.config
    num_steps = check_update_batch(batch, config)
    minis = mini_batches(batch, config, update_index=state.num_updates)
    state.num_updates += 1
    kl_coef = state.kl_controller.value
    per_step = [
        _optimizer_step(
            state,
            hooks,
            MiniBatchLoss(mini=mini, temperature=temperature, kl_coef=kl_coef, config=config.loss),
        )
        for mini in minis
    ]
    assert len(per_step) == num_steps
    metrics = {k: float(np.mean([m[k] for m in per_step])) for k in STEP_METRICS}
    metrics["lr"] = hooks.lr
    metrics["num_optimizer_steps"] = float(num_steps)
    metrics["kl_coef"] = kl_coef
    if config.loss.kl_in_loss:
        state.kl_controller.update(metrics["kl"], batch.num_samples)
    return metrics


def _optimizer_step(state: UpdateState, hooks: StepHooks, loss: MiniBatchLoss) -> dict[str, float]:
    config = state.config
    hooks.zero_grad()
    metrics = hooks.forward_backward(loss)
    max_norm = config.clip_grad if config.clip_grad > 0 else float("inf")
    lr = config.schedule.lr_at(state.num_optimizer_steps + 1)
    metrics["grad_norm"] = hooks.apply_gradients(lr=lr, max_norm=max_norm)
    state.num_optimizer_steps += 1
    return metrics


def progress_state(state: UpdateState) -> dict[str, Any]:
    """The part of ``trainer_state.pt`` an update advances (``trainer_state`` names the keys)."""
    return {
        "num_optimizer_steps": state.num_optimizer_steps,
        "num_updates": state.num_updates,
        "kl_controller": state.kl_controller.state_dict(),
    }


def restore_progress(state: UpdateState, saved: Mapping[str, Any]) -> None:
    """Undo :func:`progress_state`: the schedule and the shuffle go on where they stopped."""
    state.num_optimizer_steps = int(saved["num_optimizer_steps"])
    state.num_updates = int(saved["num_updates"])
    state.kl_controller.load_state_dict(saved["kl_controller"])
