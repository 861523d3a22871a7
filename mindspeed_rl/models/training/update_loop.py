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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from mindspeed_rl.models.loss import rollout_correction as rc
from mindspeed_rl.models.loss.grpo import GRPOLossTerms, grpo_loss
from mindspeed_rl.models.training.batch import PaddedBatch, TrainBatch, check_update_batch, mini_batches
from mindspeed_rl.models.training.exact_collectives import exact_sum_and_max
from mindspeed_rl.models.training.log_probs import check_temperature

if TYPE_CHECKING:
    from mindspeed_rl.models.loss.config import GRPOLossConfig
    from mindspeed_rl.models.loss.kl_control import KLController
    from mindspeed_rl.models.training.engine_config import TorchEngineConfig

LOSS_TERMS = ("loss", "pg_loss", "kl", "entropy", "clip_frac")
STEP_METRICS = (*LOSS_TERMS, "grad_norm")
CORRECTION_SUMS = "correction_sums"
CORRECTION_MAX = "correction_max"
_RAW_SUM, _RAW_MAX = "rc_sum:", "rc_max:"


@dataclass(frozen=True, slots=True, kw_only=True)
class MiniBatchLoss:
    """The GRPO loss of any micro-batch of ``mini``, normalised by the whole mini-batch's token and
    sequence counts: summed over micro-batches (and over DP ranks) it is the mini-batch's loss."""

    mini: TrainBatch
    temperature: float
    kl_coef: float
    config: GRPOLossConfig
    policy_version: int = 0
    """The trainer's version at the start of the update (v_prox; lag = this - a token's version)."""
    step_fraction: float = 0.0
    """k / K at the k-th of the update's K optimizer steps (log-linear proximal policy)."""
    lag_buckets: tuple[int, ...] = ()
    """The lags present in the update's batch: one block of ``rollout_corr/lag_<L>/*`` each."""

    @property
    def stats_size(self) -> tuple[int, int]:
        """Lengths of the correction statistics (0, 0 without rollout log-probs in the batch)."""
        if self.mini.rollout_log_probs is None or self.mini.versions is None:
            return 0, 0
        return rc.stats_size(len(self.lag_buckets))

    @property
    def entropy_grad(self) -> bool:
        """Whether the entropy term reaches the gradient (otherwise it is only reported)."""
        return self.config.entropy_coeff > 0

    def __call__(
        self, padded: PaddedBatch, log_probs: torch.Tensor, entropy: torch.Tensor | None
    ) -> GRPOLossTerms:
        # Without old log-probs (one step only) the behaviour policy IS the current one: ratio == 1.
        old = padded.old_log_probs if padded.old_log_probs is not None else log_probs.detach()
        correction = self._correction(padded, log_probs)
        chosen = self.config.rollout_correction
        changes = chosen is not None and correction is not None and chosen.changes_loss
        terms = grpo_loss(
            log_probs=log_probs,
            old_log_probs=correction.old_log_probs if changes and correction is not None else old,
            advantages=padded.advantages,
            mask=padded.policy_mask,  # tool-response tokens are context, not actions
            config=self.config,
            num_tokens=self.mini.num_loss_tokens,
            num_sequences=self.mini.num_samples,
            ref_log_probs=padded.ref_log_probs,
            entropy=entropy,
            kl_coef=self.kl_coef,
            pg_weights=correction.weights if changes and correction is not None else None,
            pg_keep=correction.keep if changes and correction is not None else None,
        )
        if correction is None:
            return terms
        return replace(terms, correction_sums=correction.stat_sums, correction_max=correction.stat_max)

    def _correction(self, padded: PaddedBatch, log_probs: torch.Tensor) -> rc.Correction | None:
        """The off-policy correction (and its statistics) of this micro-batch; None without the
        behaviour log-probs. Bypass without masks or weights anchors the ratio to the batch's old
        log-probs (the rollout's, in that mode) exactly as without a correction."""
        if padded.rollout_log_probs is None or padded.versions is None:
            return None
        lag = torch.clamp(self.policy_version - padded.versions, min=0)
        return rc.correct(
            log_probs=log_probs,
            behave_log_probs=padded.rollout_log_probs,
            old_log_probs=padded.old_log_probs,
            mask=padded.policy_mask,
            lag=lag,
            config=self.config.rollout_correction,
            step_fraction=self.step_fraction,
            lag_buckets=self.lag_buckets,
        )


def loss_term_values(terms: GRPOLossTerms) -> dict[str, torch.Tensor]:
    """The reported terms of one micro-batch, detached, by :data:`LOSS_TERMS` name (plus the
    correction statistics' vectors under :data:`CORRECTION_SUMS` / :data:`CORRECTION_MAX`)."""
    out = {name: getattr(terms, name).detach() for name in LOSS_TERMS}
    if terms.correction_sums is not None and terms.correction_max is not None:
        out[CORRECTION_SUMS] = terms.correction_sums.detach()
        out[CORRECTION_MAX] = terms.correction_max.detach()
    return out


class LossSums:
    """The loss terms summed over one optimizer step's micro-batches, as one float64 tensor on
    the device the engine chooses (host, or its accelerator to spare a sync per micro-batch).
    ``stats_size`` (:attr:`MiniBatchLoss.stats_size`, the same on every rank) sizes the
    off-policy statistics: summed, except their maxima (max-reduced)."""

    def __init__(self, device: torch.device | str, stats_size: tuple[int, int] = (0, 0)) -> None:
        num_sums, num_max = stats_size
        self._num_sums = num_sums
        self.values = torch.zeros(len(LOSS_TERMS) + num_sums, dtype=torch.float64, device=device)
        self.maxes = torch.zeros(num_max, dtype=torch.float64, device=device)

    def add(self, terms: Mapping[str, torch.Tensor]) -> None:
        """Add one micro-batch's terms (one-element tensors, on any device)."""
        device = self.values.device
        head = len(LOSS_TERMS)
        self.values[:head] += torch.stack(
            [terms[name].reshape(()).to(device).double() for name in LOSS_TERMS]
        )
        if self._num_sums and CORRECTION_SUMS in terms:
            self.values[head:] += terms[CORRECTION_SUMS].reshape(-1).to(device).double()
            self.maxes.copy_(torch.maximum(self.maxes, terms[CORRECTION_MAX].reshape(-1).to(device).double()))

    def all_reduce(self, group: Any = None) -> None:
        """Sum over ``group``'s ranks (each rank having added the micro-batches it scored), the
        maxima maxed, into host tensors (``totals`` reads them next). Through one all-gather and
        a float64 sum on every rank, not a float64 all-reduce: HCCL reduces no float64 on Atlas
        A2/A3 (``exact_collectives``)."""
        self.values, self.maxes = exact_sum_and_max(self.values, self.maxes, group)

    def totals(self) -> dict[str, float]:
        values = self.values.tolist()
        out = dict(zip(LOSS_TERMS, values[: len(LOSS_TERMS)], strict=True))
        out.update({f"{_RAW_SUM}{i}": v for i, v in enumerate(values[len(LOSS_TERMS) :])})
        out.update({f"{_RAW_MAX}{i}": v for i, v in enumerate(self.maxes.tolist())})
        return out


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
    version = state.num_updates
    state.num_updates += 1
    kl_coef = state.kl_controller.value
    buckets = lag_buckets(batch, version)
    per_step = [
        _optimizer_step(
            state,
            hooks,
            MiniBatchLoss(
                mini=mini,
                temperature=temperature,
                kl_coef=kl_coef,
                config=config.loss,
                policy_version=version,
                step_fraction=k / num_steps,
                lag_buckets=buckets,
            ),
        )
        for k, mini in enumerate(minis)
    ]
    assert len(per_step) == num_steps
    metrics = {k: float(np.mean([m[k] for m in per_step])) for k in STEP_METRICS}
    metrics.update(_correction_metrics(per_step, buckets))
    metrics["lr"] = hooks.lr
    metrics["num_optimizer_steps"] = float(num_steps)
    metrics["kl_coef"] = kl_coef
    if config.loss.kl_in_loss:
        state.kl_controller.update(metrics["kl"], batch.num_samples)
    return metrics


def lag_buckets(batch: TrainBatch, version: int) -> tuple[int, ...]:
    """The lags (trainer version - token version, at least 0) present in ``batch``."""
    if batch.versions is None or batch.rollout_log_probs is None:
        return ()
    lags = {max(0, version - int(v)) for row in batch.versions for v in np.unique(row)}
    return tuple(sorted(lags))


def _correction_metrics(per_step: list[dict[str, float]], buckets: tuple[int, ...]) -> dict[str, float]:
    """``rollout_corr/*`` over every step of the update (statistics summed, maxima maxed)."""
    sums = [
        sum(m[k] for m in per_step)
        for k in sorted((k for k in per_step[0] if k.startswith(_RAW_SUM)), key=_index)
    ]
    maxes = [
        max(m[k] for m in per_step)
        for k in sorted((k for k in per_step[0] if k.startswith(_RAW_MAX)), key=_index)
    ]
    for m in per_step:
        for k in [k for k in m if k.startswith((_RAW_SUM, _RAW_MAX))]:
            del m[k]
    return rc.correction_metrics(sums, maxes, buckets) if sums else {}


def _index(key: str) -> int:
    return int(key.rsplit(":", 1)[1])


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
