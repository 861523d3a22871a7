"""GRPO training engine on megatron-core: one instance per rank of a TP/PP/EP/DP layout.

Same contract as the torch engine (:class:`~mindspeed_rl.models.training.base.TrainingEngine`):
every rank receives the whole batch and returns the same results. One ``update`` runs the loop
both engines share (``update_loop.run_update``); this engine's side of a step is ``_MegatronStep``::

    for each mini-batch (one optimizer step):
        DP rank d: its slice -> micro-batches -> forward_backward_func  (loss / global mini-batch count)
        finalize_model_grads: DP all-reduce (summed), q/k-norm grads over TP, tied embeddings over PP
        GPU/NPU: megatron's optimizer (fp32 main params, grad norm + clip, distributed optimizer)
        CPU:     grad norm over TP/PP (+ EP) -> clip -> torch AdamW on fp32 masters (bf16) or params

Devices. Every tensor of a step lives on the engine's device (``TorchEngineConfig.device``): the
policy's and the reference's inputs, loss terms, norms and their accumulators, so the collectives
of the default (NCCL/HCCL) group always receive device tensors; Python objects and host-bound
shards go over the gloo host group (``groups``).

The roles around this class live in their own modules: the optimizer and its step
(``optimizer``: megatron's on an accelerator; on a CPU host, where megatron's distributed
optimizer takes only ``torch.cuda`` tensors, the torch engine's fp32-master AdamW), scoring
(``log_probs``), the reference (``reference``), the shard-by-shard weight export to rank 0's
host (``hf_export``) and MoE routing replay (``routing_replay``: a batch that carries routing is
routed by it in every forward, through megatron-core's router replay).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from mindspeed_rl.models.loss.kl_control import build_kl_controller
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.megatron import patches
from mindspeed_rl.models.training.megatron.forward import (
    Micro,
    plan_micros,
    real_rows,
    response_log_probs,
    run_micros,
)
from mindspeed_rl.models.training.megatron.groups import dp_rank_size, ensure_host_group, reports_stats
from mindspeed_rl.models.training.megatron.hf_export import (
    ShardCollector,
    gather_hf_weights,
    save_hf_folder,
    weight_tensors,
)
from mindspeed_rl.models.training.megatron.layout import MegatronLayout
from mindspeed_rl.models.training.megatron.log_probs import compute_log_probs_megatron
from mindspeed_rl.models.training.megatron.model import init_model_parallel, rank_coords
from mindspeed_rl.models.training.megatron.optimizer import (
    build_megatron_optimizer,
    ddp_config_kwargs,
    host_optimizer,
    host_step,
    megatron_step,
    uses_megatron_optimizer,
)
from mindspeed_rl.models.training.megatron.param_names import export_shard
from mindspeed_rl.models.training.megatron.reference import load_model_in_dtype
from mindspeed_rl.models.training.megatron.routing_replay import ReplayPass, ReplayStats
from mindspeed_rl.models.training.precision import ParamOptimizer
from mindspeed_rl.models.training.update_loop import (
    LOSS_TERMS,
    LossSums,
    MiniBatchLoss,
    loss_term_values,
    run_update,
)
from mindspeed_rl.weights.megatron_dims import ShardCoords, load_dims

if TYPE_CHECKING:
    from mindspeed_rl.models.rollout.weight_stream import WeightStream
    from mindspeed_rl.models.training.megatron.colocated_push import DeviceWeightBroadcast


class MegatronTrainingEngine:
    """Implements :class:`~mindspeed_rl.models.training.base.TrainingEngine` on megatron-core.

    Every method is collective: all ranks of the layout call it with the same arguments.
    """

    def __init__(
        self, model_path: str | os.PathLike[str], config: TorchEngineConfig, layout: MegatronLayout
    ) -> None:
        torch.manual_seed(config.seed)
        init_model_parallel(layout, config.seed)
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        self.config = config
        self.layout = layout
        self.dims = load_dims(model_path)
        self._source = Path(model_path)
        self._device = torch.device(config.device)
        ensure_host_group(self._device)
        self.megatron_optimizer = uses_megatron_optimizer()
        module = load_model_in_dtype(model_path, self.dims, layout, config.param_dtype)
        ddp_config = DistributedDataParallelConfig(
            **ddp_config_kwargs(config, megatron_optimizer=self.megatron_optimizer)
        )
        self.model = DistributedDataParallel(config=module.config, ddp_config=ddp_config, module=module)
        self.model.train()
        self.optimizer: Any = (
            build_megatron_optimizer(config, self.model)
            if self.megatron_optimizer
            else self.new_host_optimizer()
        )
        self.kl_controller = build_kl_controller(config.loss)
        self.num_optimizer_steps = 0
        self.num_updates = 0
        """Calls of ``update`` so far: seeds each update's mini-batch shuffle (checkpointed)."""
        self._step = _MegatronStep(self)
        self._collector: ShardCollector | None = None
        self._broadcast: DeviceWeightBroadcast | None = None

    @property
    def device(self) -> torch.device:
        return self._device

    def new_host_optimizer(self) -> ParamOptimizer:
        """The CPU path's optimizer (``precision.py``), over this rank's trainable parameters: fp32
        masters of bf16 ones. Rebuilt after weights are loaded, since the masters copy them."""
        return host_optimizer(self.config, self.model.module)

    def compute_log_probs(self, batch: TrainBatch, temperature: float) -> list[np.ndarray]:
        """Every sample's response log-probs; a batch that carries routing is replayed by it."""
        return compute_log_probs_megatron(
            self.model,
            self.dims,
            batch,
            temperature=temperature,
            micro_batch_size=self.config.forward_micro_batch_size,
            pad_token_id=self.config.pad_token_id,
            device=self._device,
        )

    def compute_log_probs_and_routing(
        self, batch: TrainBatch, temperature: float
    ) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, float]]:
        """MoE routing replay (the torch engine's contract): ``compute_log_probs`` plus each
        sample's routing as the routers used it (``batch.routing`` replayed where given, the
        routers' own choice otherwise: R2's record) and ``routing/recompute_*`` metrics
        (``routing_replay``)."""
        replay = ReplayPass(self.model, replay=batch.routing is not None, capture=True)
        with replay.session():
            log_probs = compute_log_probs_megatron(
                self.model,
                self.dims,
                batch,
                temperature=temperature,
                micro_batch_size=self.config.forward_micro_batch_size,
                pad_token_id=self.config.pad_token_id,
                device=self._device,
                replay=replay,
            )
        lengths = [(p.size, r.size) for p, r in zip(batch.prompt_ids, batch.response_ids)]
        used = replay.gather(lengths, self.dims.num_layers, int(self.dims.moe_topk or 0))
        return log_probs, used, _replay_metrics("recompute", replay.total_stats())

    @property
    def kl_coef(self) -> float:
        return self.kl_controller.value

    def observe_kl(self, kl: float, num_samples: int) -> None:
        self.kl_controller.update(kl, num_samples)

    def update(self, batch: TrainBatch, temperature: float) -> dict[str, float]:
        """One GRPO update; a batch that carries routing is replayed by it in every forward."""
        if batch.routing is None:
            return run_update(self, self._step, batch, temperature)
        replay = ReplayPass(self.model, replay=True, capture=False)
        with replay.session():
            self._step.replay = replay
            try:
                metrics = run_update(self, self._step, batch, temperature)
            finally:
                self._step.replay = None
        return {**metrics, **_replay_metrics("train", replay.total_stats())}

    def snapshot_shard(self) -> tuple[dict[str, torch.Tensor], ShardCoords]:
        """This rank's weights in the training layout (global megatron names, this rank's shapes),
        copied to host: what the rank writes into a snapshot for the GU's convert."""
        coords = rank_coords(self.layout)
        host = {name: t.cpu() for name, t in weight_tensors(self.model.module).items()}
        return export_shard(host, self.dims, coords), coords

    def _shards(self) -> ShardCollector:
        if self._collector is None:
            self._collector = ShardCollector(self.dims, self.layout)
        return self._collector

    def named_weights_for_inference(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective: every rank must call it; rank 0 yields the whole model (host tensors,
        merged from the shards in a temporary folder of its own), the others nothing (a Training
        Unit group returns rank 0's result)."""
        yield from gather_hf_weights(
            self.model.module, self.dims, self.layout, collector=self._shards()
        ).items()

    def weight_stream(self) -> WeightStream:
        """Collective: every rank gets the whole HF model on its device, group by group, for the
        rollout engine rank in its process (``colocated_push``)."""
        from mindspeed_rl.models.training.megatron.colocated_push import DeviceWeightBroadcast

        if self._broadcast is None:
            self._broadcast = DeviceWeightBroadcast(self.dims, self.layout)
        return self._broadcast.stream(self.model.module)

    def save_hf(self, path: str | os.PathLike[str]) -> None:
        """An HF folder (one ``model.safetensors`` + the source's config and tokenizer), written by
        rank 0 from every shard, merged on its host one tensor group at a time (``hf_export``)."""
        save_hf_folder(self._shards(), self.model.module, self._source, path)

    def save_state(self, path: str | os.PathLike[str], *, optimizer: bool = True, rng: bool = True) -> None:
        """A resumable checkpoint: megatron's distributed checkpoint + an HF folder (``checkpoint.py``)."""
        from mindspeed_rl.models.training.megatron import checkpoint

        checkpoint.save(self, path, optimizer=optimizer, rng=rng)

    def load_state(self, path: str | os.PathLike[str], *, optimizer: bool = True, rng: bool = True) -> None:
        """Continue from ``save_state``'s folder, saved at this layout or any other."""
        from mindspeed_rl.models.training.megatron import checkpoint

        checkpoint.load(self, path, optimizer=optimizer, rng=rng)

    def layout_key(self) -> dict[str, int]:
        """The layout a checkpoint records (per-rank state is only valid at the same one)."""
        return {
            "tp": self.layout.tensor_model_parallel_size,
            "pp": self.layout.pipeline_model_parallel_size,
            "ep": self.layout.expert_model_parallel_size,
            "world_size": dist.get_world_size(),
        }


class _MegatronStep:
    """The megatron engine's side of an optimizer step (``update_loop.StepHooks``): megatron's
    schedule over this DP rank's micro-batches, megatron DDP's gradient reduction
    (``finalize_model_grads``), loss sums on the device reduced over every rank, then megatron's
    optimizer or, on a CPU host, the torch optimizers on ``main_grad`` (module docstring)."""

    def __init__(self, engine: MegatronTrainingEngine) -> None:
        self._engine = engine
        self.replay: ReplayPass | None = None
        """Routing replay's pass while an update replays routing (``MegatronTrainingEngine.update``)."""

    def zero_grad(self) -> None:
        self._engine.model.zero_grad_buffer()
        self._engine.optimizer.zero_grad()

    def forward_backward(self, loss: MiniBatchLoss) -> dict[str, float]:
        from megatron.core.distributed import finalize_model_grads

        engine = self._engine
        dp_rank, dp_size = dp_rank_size()
        micros = plan_micros(
            loss.mini,
            dp_rank=dp_rank,
            dp_size=dp_size,
            micro_batch_size=engine.config.micro_batch_size,
            pad_token_id=engine.config.pad_token_id,
            device=engine.device,
        )
        outputs = run_micros(
            engine.model,
            micros,
            partial(self._micro_loss, loss),
            forward_only=False,
            around_forward=None if self.replay is None else self.replay.micro,
        )
        with patches.cpu_runtime_mode():
            finalize_model_grads([engine.model])
        sums = LossSums(engine.device, loss.stats_size)
        if reports_stats():
            for out in outputs:
                sums.add(out)
        sums.all_reduce()
        return sums.totals()

    def _micro_loss(
        self, loss: MiniBatchLoss, micro: Micro, logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        count = micro.indices.size
        if count == 0:  # a DP rank's filler micro-batch: same collectives, no loss
            zero = logits.sum() * 0.0
            none = torch.zeros((), dtype=torch.int64, device=logits.device)
            return zero, none, {name: zero.detach().reshape(1) for name in LOSS_TERMS}
        padded = real_rows(micro.padded, count)
        logp, entropy = response_log_probs(
            logits[:count],
            padded,
            loss.temperature,
            vocab_size=self._engine.dims.vocab_size,
            with_entropy=True,
        )
        assert entropy is not None
        if not loss.entropy_grad:
            entropy = entropy.detach()
        terms = loss(padded, logp, entropy)
        # Scalars as one-element tensors; the correction statistics are vectors already.
        stats = {name: value.reshape(-1) for name, value in loss_term_values(terms).items()}
        return terms.loss, padded.policy_mask.sum().to(torch.int64), stats

    def apply_gradients(self, *, lr: float, max_norm: float) -> float:
        engine = self._engine
        if engine.megatron_optimizer:
            return megatron_step(engine.optimizer, lr=lr, weight_decay=engine.config.weight_decay)
        return host_step(engine.model, engine.optimizer, lr=lr, max_norm=max_norm, device=engine.device)

    @property
    def lr(self) -> float:
        optimizer = self._engine.optimizer
        return float(optimizer.param_groups[0]["lr"]) if self._engine.megatron_optimizer else optimizer.lr


def _replay_metrics(stage: str, stats: ReplayStats) -> dict[str, float]:
    """The torch engine's ``routing/*`` names for one pass's replay statistics."""
    rows = max(1, stats.replayed)
    return {
        f"routing/{stage}_replayed_rows": float(stats.replayed),
        f"routing/{stage}_router_disagree_frac": stats.natural_differs / rows,
    }
