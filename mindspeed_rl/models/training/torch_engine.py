"""GRPO training engine for an HF causal-LM folder with plain torch, on CPU, CUDA or NPU.

One ``update`` call consumes one global batch::

    for epoch in range(epochs):
        order = permutation(samples) if shuffle_mini_batch else identity
        for mini in chunks(order, mini_batch_size * n):          # one optimizer step each
            for micro in chunks(sorted_by_length(mini), micro_batch_size):   # grad accumulation
                loss(micro) / tokens(mini)  [or / sequences(mini)] -> backward
            lr = schedule.lr_at(step); clip_grad_norm(clip_grad); AdamW.step()
    kl_controller.update(mean kl, samples)          # adaptive KL: coefficient for the next update

The engine carries the state that outlives one update: the optimizer step count (which drives the
learning-rate schedule) and the KL coefficient (adaptive controller). Precision (fp32, or bf16
with fp32 masters) is the optimizer's business (``precision.py``); log-probs are projected to the
vocabulary in chunks (``log_probs.chunked_log_probs``); weights leave in checkpoint names and the
rollout dtype (``named_weights_for_inference``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mindspeed_rl.models.loss.grpo import grpo_loss
from mindspeed_rl.models.loss.kl_control import build_kl_controller
from mindspeed_rl.models.training.batch import TrainBatch, check_update_batch, mini_batches, pad_batch
from mindspeed_rl.models.training.device import resolve_device, torch_dtype
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.hf_names import tied_targets, to_checkpoint_format
from mindspeed_rl.models.training.log_probs import (
    check_temperature,
    compute_response_log_probs,
    forward_with_entropy,
    micro_batches,
)
from mindspeed_rl.models.training.precision import AdamWSettings, ParamOptimizer, build_optimizer
from mindspeed_rl.models.training.reference import load_causal_lm

if TYPE_CHECKING:
    from transformers import PreTrainedModel

STEP_METRICS = ("loss", "pg_loss", "kl", "entropy", "clip_frac", "grad_norm")
# Files of an HF folder that are not weights; copied by save_hf so the folder stays loadable.
_NON_WEIGHT_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")


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

    def update(self, batch: TrainBatch, temperature: float) -> dict[str, float]:
        check_temperature(temperature)
        num_steps = check_update_batch(batch, self.config)
        minis = mini_batches(batch, self.config, update_index=self.num_updates)
        self.num_updates += 1
        kl_coef = self.kl_controller.value
        per_step = [self._optimizer_step(mini, temperature, kl_coef) for mini in minis]
        assert len(per_step) == num_steps
        metrics = {k: float(np.mean([m[k] for m in per_step])) for k in STEP_METRICS}
        metrics["lr"] = self.optimizer.lr
        metrics["num_optimizer_steps"] = float(num_steps)
        metrics["kl_coef"] = kl_coef
        if self.config.loss.kl_in_loss:
            self.kl_controller.update(metrics["kl"], batch.num_samples)
        return metrics

    @property
    def kl_coef(self) -> float:
        """The KL coefficient the next update (or KL-shaped reward) uses."""
        return self.kl_controller.value

    def observe_kl(self, kl: float, num_samples: int) -> None:
        """Feed the controller the KL measured outside the loss (``use_kl_in_reward``)."""
        self.kl_controller.update(kl, num_samples)

    def _optimizer_step(self, mini: TrainBatch, temperature: float, kl_coef: float) -> dict[str, float]:
        cfg = self.config
        num_tokens = mini.num_response_tokens
        self.optimizer.zero_grad()
        sums = dict.fromkeys(STEP_METRICS, 0.0)
        for _, micro in micro_batches(mini, cfg.micro_batch_size):
            padded = pad_batch(micro, pad_token_id=cfg.pad_token_id, device=self._device)
            logp, entropy = forward_with_entropy(
                self.model,
                padded,
                temperature,
                entropy_grad=cfg.loss.entropy_coeff > 0,
                chunk_tokens=cfg.log_prob_chunk_tokens,
            )
            # Without old log-probs (one step only) the behaviour policy IS the current one: ratio == 1.
            old = padded.old_log_probs if padded.old_log_probs is not None else logp.detach()
            terms = grpo_loss(
                log_probs=logp,
                old_log_probs=old,
                advantages=padded.advantages,
                mask=padded.response_mask,
                config=cfg.loss,
                num_tokens=num_tokens,
                num_sequences=mini.num_samples,
                ref_log_probs=padded.ref_log_probs,
                entropy=entropy,
                kl_coef=kl_coef,
            )
            terms.loss.backward()
            self.optimizer.after_backward()
            for name in ("loss", "pg_loss", "kl", "entropy", "clip_frac"):
                sums[name] += float(getattr(terms, name).item())
        max_norm = cfg.clip_grad if cfg.clip_grad > 0 else float("inf")
        grad_norm = self.optimizer.clip_grad_norm(max_norm)
        self.optimizer.step(cfg.schedule.lr_at(self.num_optimizer_steps + 1))
        self.num_optimizer_steps += 1
        sums["grad_norm"] = float(grad_norm.item())
        return sums

    def named_weights_for_inference(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The working parameters (what this engine's log-probs are computed with) under checkpoint
        names (tied copies left out, fused experts split per expert; ``hf_names``), as CPU tensors
        of the rollout dtype: the bytes a snapshot writes are the bytes vLLM loads."""
        state = self.model.state_dict()
        for name, tensor in to_checkpoint_format(state.items(), tied=tied_targets(self.model)):
            yield name, tensor.detach().to(device="cpu", dtype=self._export_dtype).contiguous()

    def save_hf(self, path: str | os.PathLike[str], *, max_shard_size: str | int = "5GB") -> None:
        """An HF folder of the working parameters (bf16 runs write bf16, as HF releases do),
        split into ``max_shard_size`` safetensors shards with an index when larger."""
        target = Path(path)
        target.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(target, max_shard_size=max_shard_size)
        if target.resolve() != self._source.resolve():
            for f in self._source.iterdir():
                copyable = f.is_file() and f.suffix in _NON_WEIGHT_SUFFIXES and ".safetensors" not in f.name
                if copyable and not (target / f.name).exists():
                    shutil.copy2(f, target / f.name)

    def policy_for_eval(self) -> PreTrainedModel:
        """The live model itself: held-out decoding reads the weights being trained, no copy."""
        return self.model

    def save_state(self, path: str | os.PathLike[str], *, optimizer: bool = True, rng: bool = True) -> None:
        """A resumable checkpoint: the HF folder of ``save_hf`` (still loadable as a model) plus
        ``trainer_state.pt`` (``trainer_state``). ``optimizer`` / ``rng`` False: no_save_optim / no_save_rng."""
        from mindspeed_rl.models.training import trainer_state

        self.save_hf(path)
        trainer_state.save_trainer_state(
            path,
            {
                "num_optimizer_steps": self.num_optimizer_steps,
                "num_updates": self.num_updates,
                "kl_controller": self.kl_controller.state_dict(),
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
        self.num_optimizer_steps = int(state["num_optimizer_steps"])
        self.num_updates = int(state["num_updates"])
        self.kl_controller.load_state_dict(state["kl_controller"])
        if rng:
            trainer_state.restore_rng(state["rng"])
