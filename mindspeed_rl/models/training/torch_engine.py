"""GRPO training engine for an HF causal-LM folder with plain torch, on CPU, CUDA or NPU.

One ``update`` call consumes one global batch::

    for epoch in range(epochs):
        order = permutation(samples) if shuffle_mini_batch else identity
        for mini in chunks(order, mini_batch_size * n):          # one optimizer step each
            for micro in chunks(sorted_by_length(mini), micro_batch_size):   # grad accumulation
                loss(micro) / tokens(mini)  [or / sequences(mini)] -> backward
            lr = schedule.lr_at(step); clip_grad_norm(clip_grad); AdamW.step()
    kl_controller.update(mean kl, samples)          # adaptive KL: coefficient for the next update

The loop is ``update_loop.run_update``, shared with the megatron engine; what is this engine's
own (its micro-batch loop, where loss sums accumulate, its optimizer) is ``_TorchStep``.
The engine carries the state that outlives one update: the optimizer step count (which drives the
learning-rate schedule) and the KL coefficient (adaptive controller). Precision (fp32, or bf16
with fp32 masters) is the optimizer's business (``precision.py``); log-probs are projected to the
vocabulary in chunks (``log_probs.chunked_log_probs``); weights leave in checkpoint names and the
rollout dtype (``named_weights_for_inference``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from mindspeed_rl.models import transformers_compat
from mindspeed_rl.models.loss.kl_control import build_kl_controller
from mindspeed_rl.models.moe_routing import ReplayStats
from mindspeed_rl.models.rollout.weight_stream import WeightStream
from mindspeed_rl.models.training.batch import TrainBatch, pad_batch
from mindspeed_rl.models.training.device import resolve_device, torch_dtype
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.hf_folder import copy_non_weight_files
from mindspeed_rl.models.training.hf_names import tied_targets, to_checkpoint_format
from mindspeed_rl.models.training.log_probs import (
    compute_response_log_probs,
    forward_with_entropy,
    micro_batches,
)
from mindspeed_rl.models.training.precision import AdamWSettings, ParamOptimizer, build_optimizer
from mindspeed_rl.models.training.reference import load_causal_lm
from mindspeed_rl.models.training.update_loop import (
    LossSums,
    MiniBatchLoss,
    loss_term_values,
    progress_state,
    restore_progress,
    run_update,
)


class TorchTrainingEngine:
    """Implements :class:`~mindspeed_rl.models.training.base.TrainingEngine` with torch + transformers."""

    def __init__(self, model_path: str | os.PathLike[str], config: TorchEngineConfig) -> None:
        torch.manual_seed(config.seed)
        self.config = config
        self._source = Path(model_path)
        self._device = resolve_device(config.device)
        self.model = load_causal_lm(model_path, self._device, torch_dtype(config.param_dtype))
        self.model.train()
        self.optimizer = self._new_optimizer()
        self._export_dtype = torch_dtype(config.export_dtype or config.param_dtype)
        self.kl_controller = build_kl_controller(config.loss)
        self.num_optimizer_steps = 0
        self.num_updates = 0
        """Calls of ``update`` so far: seeds each update's mini-batch shuffle (checkpointed)."""
        self._step = _TorchStep(self)

    def _new_optimizer(self) -> ParamOptimizer:
        config = self.config
        return build_optimizer(
            self.model,
            AdamWSettings(
                lr=config.schedule.lr_at(1),
                weight_decay=config.weight_decay,
                betas=(config.adam_beta1, config.adam_beta2),
                eps=config.adam_eps,
            ),
        )

    def compute_log_probs(self, batch: TrainBatch, temperature: float) -> list[np.ndarray]:
        return compute_response_log_probs(
            self.model,
            batch,
            temperature=temperature,
            micro_batch_size=self.config.forward_micro_batch_size,
            pad_token_id=self.config.pad_token_id,
            device=self._device,
            chunk_tokens=self.config.log_prob_chunk_tokens,
        )

    def compute_log_probs_and_routing(
        self, batch: TrainBatch, temperature: float
    ) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, float]]:
        """MoE routing replay: ``compute_log_probs`` plus each sample's routing as this forward
        used it (``batch.routing`` replayed where given, the routers' own choice elsewhere) and
        ``routing/*`` metrics: the fraction of replayed (position, layer) rows whose router alone
        would have chosen another expert set."""
        from mindspeed_rl.models.training.log_probs import collect_replay_stats

        routing: list[np.ndarray | None] = [None] * batch.num_samples
        with collect_replay_stats(self.model) as stats:
            log_probs = compute_response_log_probs(
                self.model,
                batch,
                temperature=temperature,
                micro_batch_size=self.config.forward_micro_batch_size,
                pad_token_id=self.config.pad_token_id,
                device=self._device,
                chunk_tokens=self.config.log_prob_chunk_tokens,
                routing_out=routing,
            )
        return log_probs, [r for r in routing if r is not None], _replay_metrics("recompute", stats)

    def update(self, batch: TrainBatch, temperature: float) -> dict[str, float]:
        if batch.routing is None:
            return run_update(self, self._step, batch, temperature)
        from mindspeed_rl.models.training.log_probs import collect_replay_stats

        with collect_replay_stats(self.model) as stats:
            metrics = run_update(self, self._step, batch, temperature)
        return {**metrics, **_replay_metrics("train", stats)}

    @property
    def kl_coef(self) -> float:
        """The KL coefficient the next update (or KL-shaped reward) uses."""
        return self.kl_controller.value

    def observe_kl(self, kl: float, num_samples: int) -> None:
        """Feed the controller the KL measured outside the loss (``use_kl_in_reward``)."""
        self.kl_controller.update(kl, num_samples)

    def named_weights_for_inference(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The working parameters (what this engine's log-probs are computed with) under checkpoint
        names (tied copies left out, fused experts split per expert; ``hf_names``), as CPU tensors
        of the rollout dtype: the bytes a snapshot writes are the bytes vLLM loads."""
        state = self.model.state_dict()
        for name, tensor in to_checkpoint_format(state.items(), tied=tied_targets(self.model)):
            yield name, tensor.detach().to(device="cpu", dtype=self._export_dtype).contiguous()

    def weight_stream(self) -> WeightStream:
        """The same weights as ``named_weights_for_inference``, left on the engine's device (the
        colocated push: the engine in this process copies each into its own parameter)."""
        state = self.model.state_dict()
        named = list(to_checkpoint_format(state.items(), tied=tied_targets(self.model)))
        return WeightStream(
            shapes=tuple((name, tuple(t.shape)) for name, t in named),
            tensors=((name, t.detach().to(dtype=self._export_dtype)) for name, t in named),
        )

    def save_hf(self, path: str | os.PathLike[str], *, max_shard_size: str | int = "5GB") -> None:
        """An HF folder of the working parameters (bf16 runs write bf16, as HF releases do),
        split into ``max_shard_size`` safetensors shards with an index when larger."""
        target = Path(path)
        target.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(target, max_shard_size=max_shard_size)
        copy_non_weight_files(self._source, target)
        transformers_compat.write_portable_config(target)  # read alike by transformers 4.x and 5.x

    def save_state(self, path: str | os.PathLike[str], *, optimizer: bool = True, rng: bool = True) -> None:
        """A resumable checkpoint: the HF folder of ``save_hf`` (still loadable as a model) plus
        ``trainer_state.pt`` (``trainer_state``). ``optimizer`` / ``rng`` False: no_save_optim / no_save_rng."""
        from mindspeed_rl.models.training import trainer_state

        self.save_hf(path)
        trainer_state.save_trainer_state(
            path,
            {
                **progress_state(self),
                "optimizer": self.optimizer.state_dict() if optimizer else None,
                "rng": trainer_state.capture_rng() if rng else None,
            },
        )

    def load_state(self, path: str | os.PathLike[str], *, optimizer: bool = True, rng: bool = True) -> None:
        """Continue from ``save_state``'s folder: weights, step counts (so the LR schedule and the
        mini-batch shuffle go on where they stopped), KL coefficient; the optimizer and RNG states
        unless ``optimizer`` / ``rng`` is False (no_load_optim / no_load_rng: fresh AdamW moments)."""
        from mindspeed_rl.models.training import trainer_state

        state = trainer_state.load_trainer_state(path)
        trainer_state.check_loadable(state, path, engine="torch", optimizer=optimizer, rng=rng)
        saved = load_causal_lm(path, self._device, torch_dtype(self.config.param_dtype))
        self.model.load_state_dict(saved.state_dict())
        del saved
        # The masters of a bf16 optimizer are copies of the weights: rebuild, then overwrite.
        self.optimizer = self._new_optimizer()
        if optimizer:
            self.optimizer.load_state_dict(state["optimizer"])
        restore_progress(self, state)
        if rng:
            trainer_state.restore_rng(state["rng"])


def _replay_metrics(stage: str, stats: ReplayStats) -> dict[str, float]:
    rows = max(1, stats.replayed)
    return {
        f"routing/{stage}_replayed_rows": float(stats.replayed),
        f"routing/{stage}_router_disagree_frac": stats.natural_differs / rows,
    }


class _TorchStep:
    """The torch engine's side of an optimizer step (``update_loop.StepHooks``): a python loop
    over length-sorted micro-batches, loss sums on the engine's device (read once per step, not
    once per micro-batch), and the precision-aware optimizer (``precision.py``), which
    accumulates each micro-batch's gradient after its backward."""

    def __init__(self, engine: TorchTrainingEngine) -> None:
        self._engine = engine

    def zero_grad(self) -> None:
        self._engine.optimizer.zero_grad()

    def forward_backward(self, loss: MiniBatchLoss) -> dict[str, float]:
        engine, cfg = self._engine, self._engine.config
        sums = LossSums(engine._device, loss.stats_size)
        for _, micro in micro_batches(loss.mini, cfg.micro_batch_size):
            padded = pad_batch(micro, pad_token_id=cfg.pad_token_id, device=engine._device)
            logp, entropy = forward_with_entropy(
                engine.model,
                padded,
                loss.temperature,
                entropy_grad=loss.entropy_grad,
                chunk_tokens=cfg.log_prob_chunk_tokens,
            )
            terms = loss(padded, logp, entropy)
            terms.loss.backward()
            engine.optimizer.after_backward()
            sums.add(loss_term_values(terms))
        return sums.totals()

    def apply_gradients(self, *, lr: float, max_norm: float) -> float:
        grad_norm = self._engine.optimizer.clip_grad_norm(max_norm)
        self._engine.optimizer.step(lr)
        return float(grad_norm.item())

    @property
    def lr(self) -> float:
        return self._engine.optimizer.lr
