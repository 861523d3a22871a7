"""Settings of the torch training engine, in upstream MindSpeed-RL's names and batch-size units.

Torch-free: the config mapper (``trainer.run_plan``) builds and validates it without torch.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Literal

from mindspeed_rl.models.loss.config import GRPOLossConfig
from mindspeed_rl.models.training.lr_schedule import LRSchedule

Device = Literal["cpu", "cuda", "npu"]
ParamDtype = Literal["float32", "bfloat16"]
ExportDtype = Literal["float32", "bfloat16", "float16"]


@dataclass(slots=True, frozen=True, kw_only=True)
class TorchEngineConfig:
    """One engine's optimisation settings (``actor_config`` + ``rl_config`` keys)."""

    lr: float = 1e-6
    """Peak AdamW learning rate (the schedule's ``lr``)."""
    lr_schedule: LRSchedule | None = None
    """Per-optimizer-step schedule; None = constant ``lr``."""
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    """Max global grad-norm; 0 disables clipping (the norm is still reported)."""
    micro_batch_size: int = 1
    """Samples per forward/backward in ``update`` (gradient accumulation unit)."""
    forward_micro_batch_size: int = 8
    """Samples per forward in ``compute_log_probs`` (upstream ``actor_forward_micro_batch_size``)."""
    mini_batch_size: int = 1
    """PROMPTS per optimizer step; the engine multiplies by ``n_samples_per_prompt``."""
    n_samples_per_prompt: int = 8
    epochs: int = 1
    shuffle_mini_batch: bool = False
    loss: GRPOLossConfig = field(default_factory=GRPOLossConfig)
    seed: int = 1
    device: Device = "cpu"
    """Where the policy and the reference live: ``cuda`` when the Training Unit is given Ray GPUs,
    ``npu`` for the custom ``NPU`` resource (``torch_npu`` is imported then only), else ``cpu``."""
    param_dtype: ParamDtype = "float32"
    """``bfloat16`` (``bf16: true``): bf16 working parameters for forward/backward, fp32 master
    weights, fp32 gradient accumulation (the megatron engine: ``accumulate_allreduce_grads_in_fp32``)
    and fp32 AdamW state (``precision.MasterWeightOptimizer``; megatron's optimizer on GPU/NPU).
    Honoured on every device, CPU included when asked; the shipped tiny CPU configs keep float32
    so the trainer's log-probs match the fp32 rollout to ~1e-6."""
    export_dtype: ExportDtype | None = None
    """Dtype of the tensors a snapshot carries (``generate_config.dtype``): the bytes written are
    the bytes the rollout engine loads. None (``dtype: auto``): the parameter dtype."""
    log_prob_chunk_tokens: int = 1024
    """Response tokens projected to the vocabulary at once: log-prob memory is bounded by
    ``chunk x vocab`` floats however long the micro-batch (152k vocab: 0.6 GB per fp32 chunk)."""
    pad_token_id: int = 0
    """Filler id for right padding; any valid id works since padded positions are masked."""
    use_distributed_optimizer: bool = False
    """Megatron engine on GPU/NPU (``actor_config.use_distributed_optimizer``): megatron's
    DistributedOptimizer shards the fp32 master weights and Adam moments over the data-parallel
    ranks (gradients are reduce-scattered, updated weights all-gathered). Has no effect on a CPU
    host, where the engine steps a torch optimizer on every rank's whole shard, nor in the torch
    engine (one process, nothing to shard over)."""
    accumulate_allreduce_grads_in_fp32: bool = False
    """Megatron engine (``actor_config.accumulate_allreduce_grads_in_fp32``, upstream's key and its
    default): DDP's gradient buffer, where micro-batch gradients accumulate and which the DP
    all-reduce sums, is fp32 instead of the parameters' dtype. Off under ``bf16: true``: bf16
    gradients (half the buffer), cast to fp32 for the optimizer step. The torch engine always
    accumulates micro-batch gradients in its fp32 masters (``precision.py``)."""

    def __post_init__(self) -> None:
        positive = {
            "micro_batch_size": self.micro_batch_size,
            "forward_micro_batch_size": self.forward_micro_batch_size,
            "mini_batch_size": self.mini_batch_size,
            "n_samples_per_prompt": self.n_samples_per_prompt,
            "epochs": self.epochs,
        }
        bad = {k: v for k, v in positive.items() if v < 1}
        if bad:
            raise ValueError(
                f"these batch settings must be >= 1: {bad}; fix them in actor_config / rl_config"
            )
        if self.lr <= 0 or self.clip_grad < 0 or self.weight_decay < 0:
            raise ValueError(
                f"need lr > 0, clip_grad >= 0, weight_decay >= 0; got lr={self.lr}, clip_grad={self.clip_grad}, "
                f"weight_decay={self.weight_decay}"
            )
        if self.lr_schedule is not None and self.lr_schedule.lr != self.lr:
            raise ValueError(
                f"lr_schedule.lr={self.lr_schedule.lr} differs from lr={self.lr}; build both from actor_config.lr"
            )
        if self.device not in typing.get_args(Device):
            raise ValueError(
                f"device={self.device!r}; use one of {typing.get_args(Device)} (chosen from the "
                "Training Unit's resources: num_gpus -> cuda, num_npus -> npu, neither -> cpu)"
            )
        if self.param_dtype not in typing.get_args(ParamDtype):
            raise ValueError(
                f"param_dtype={self.param_dtype!r}; use float32 or bfloat16 (bf16: true). fp16 needs "
                "loss scaling, which the torch engine does not implement"
            )
        if self.export_dtype is not None and self.export_dtype not in typing.get_args(ExportDtype):
            raise ValueError(
                f"export_dtype={self.export_dtype!r}; set generate_config.dtype to one of "
                f"{typing.get_args(ExportDtype)} or auto"
            )
        if self.log_prob_chunk_tokens < 1:
            raise ValueError(f"log_prob_chunk_tokens={self.log_prob_chunk_tokens}; use >= 1 (e.g. 1024)")

    @property
    def samples_per_mini_batch(self) -> int:
        return self.mini_batch_size * self.n_samples_per_prompt

    @property
    def schedule(self) -> LRSchedule:
        return self.lr_schedule if self.lr_schedule is not None else LRSchedule(lr=self.lr)
