"""GRPO training engine on megatron-core: one instance per rank of a TP/PP/EP/DP layout.

Same contract as the torch engine (:class:`~mindspeed_rl.models.training.base.TrainingEngine`):
every rank receives the whole batch and returns the same results. One ``update`` runs the loop
both engines share (``update_loop.run_update``); this engine's side of a step is ``_MegatronStep``::

    for each mini-batch (one optimizer step):
        DP rank d: its slice -> micro-batches -> forward_backward_func  (loss / global mini-batch count)
        finalize_model_grads: DP all-reduce (summed), q/k-norm grads over TP, tied embeddings over PP
        grad norm over TP/PP (+ EP for experts) -> clip -> AdamW.step() on main_grad

Optimizer, and why a torch one: megatron's ``get_megatron_optimizer`` allocates on "cuda" and its
distributed optimizer accepts only ``torch.cuda.*Tensor`` parameters, so it cannot run on a CPU
host. The engine therefore steps ``torch.optim.AdamW`` on megatron DDP's ``main_grad`` buffers;
with the per-rank shards and identical gradients on DP replicas this is the plain (non-sharded)
optimizer, exact in fp32. On accelerators the megatron distributed optimizer is the production
choice, in place of ``_MegatronStep.apply_gradients``; it is not wired here because this machine
cannot exercise it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from mindspeed_rl.models.loss.kl_control import build_kl_controller
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.hf_folder import copy_non_weight_files
from mindspeed_rl.models.training.log_probs import check_temperature
from mindspeed_rl.models.training.megatron import patches
from mindspeed_rl.models.training.megatron.forward import (
    Micro,
    plan_micros,
    real_rows,
    response_log_probs,
    run_micros,
)
from mindspeed_rl.models.training.megatron.hf_mapping import (
    GPTDims,
    ShardCoords,
    assemble_hf,
    export_shard,
    hf_pieces,
    is_weight_name,
    load_dims,
)
from mindspeed_rl.models.training.megatron.layout import MegatronLayout
from mindspeed_rl.models.training.megatron.model import init_model_parallel, load_model, rank_coords
from mindspeed_rl.models.training.update_loop import (
    LOSS_TERMS,
    LossSums,
    MiniBatchLoss,
    loss_term_values,
    run_update,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _dp() -> tuple[int, int]:
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()


def _reports_stats() -> bool:
    """One rank per DP replica reports loss terms (the last stage's TP rank 0)."""
    from megatron.core import parallel_state as ps

    return ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0


def compute_log_probs_megatron(
    model: torch.nn.Module,
    dims: GPTDims,
    batch: TrainBatch,
    *,
    temperature: float,
    micro_batch_size: int,
    pad_token_id: int,
    device: torch.device,
) -> list[np.ndarray]:
    """Response log-probs of every sample, identical on every rank (a collective call)."""
    check_temperature(temperature)
    dp_rank, dp_size = _dp()
    micros = plan_micros(
        batch,
        dp_rank=dp_rank,
        dp_size=dp_size,
        micro_batch_size=micro_batch_size,
        pad_token_id=pad_token_id,
        device=device,
    )

    def loss_fn(
        micro: Micro, logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        logp, _ = response_log_probs(
            logits, micro.padded, temperature, vocab_size=dims.vocab_size, with_entropy=False
        )
        return logits.sum() * 0.0, torch.tensor(1), {"logp": logp.detach().cpu()}

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            outputs = run_micros(model, micros, loss_fn, forward_only=True)
    finally:
        model.train(was_training)
    local: dict[int, np.ndarray] = {}
    if _reports_stats():
        for micro, out in zip(micros, outputs, strict=True):
            for row, (i, r) in enumerate(zip(micro.indices, micro.batch.response_ids)):
                local[int(i)] = out["logp"][row, : r.size].numpy().copy()
    gathered: list[dict[int, np.ndarray] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    merged: dict[int, np.ndarray] = {}
    for part in gathered:
        merged.update(part or {})
    missing = sorted(set(range(batch.num_samples)) - set(merged))
    assert not missing, f"no rank scored samples {missing[:5]}"
    return [merged[i] for i in range(batch.num_samples)]


def _shard_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: t.detach().cpu()
        for name, t in model.state_dict().items()
        if is_weight_name(name) and isinstance(t, torch.Tensor)
    }


def gather_hf_weights(
    model: torch.nn.Module, dims: GPTDims, layout: MegatronLayout
) -> dict[str, torch.Tensor]:
    """The full HF-named weights on rank 0, ``{}`` on the other ranks (a collective: every rank
    sends its shards, only rank 0 receives, so the full model is never on every rank).

    Meant for ``final_model``, checkpoints' HF copy, evaluation and the hybrid push; snapshots
    export per-rank shards instead.
    """
    coords = rank_coords(layout)
    pieces = [p for name, t in _shard_weights(model).items() for p in hf_pieces(name, t, dims, coords)]
    dp_rank, _ = _dp()
    from megatron.core import parallel_state as ps

    # DP replicas of dense weights are identical; experts differ per EP rank, so EP "DP" ranks send too.
    keep = dp_rank == 0 or ps.get_expert_data_parallel_rank() == 0
    receiver = dist.get_rank() == 0
    gathered: list[list[Any] | None] | None = [None] * dist.get_world_size() if receiver else None
    dist.gather_object(pieces if keep else [], gathered, dst=0)
    if gathered is None:
        return {}
    unique: dict[tuple[str, int | None, int], Any] = {}
    for part in gathered:
        for p in part or []:
            unique.setdefault((p.name, p.dim, p.index), p)
    return assemble_hf(unique.values(), dims)


class MegatronReferenceModel:
    """The frozen initial policy, sharded like the trained one (same layout, no DDP, no grads)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        layout: MegatronLayout,
        *,
        micro_batch_size: int,
        pad_token_id: int = 0,
        seed: int = 1,
    ) -> None:
        init_model_parallel(layout, seed)
        self.dims = load_dims(model_path)
        self._model = load_model(model_path, self.dims, layout, param_dtype="float32")
        self._model.requires_grad_(False)
        self._micro_batch_size = micro_batch_size
        self._pad_token_id = pad_token_id

    def compute_log_probs(self, batch: TrainBatch, temperature: float) -> list[np.ndarray]:
        return compute_log_probs_megatron(
            self._model,
            self.dims,
            batch,
            temperature=temperature,
            micro_batch_size=self._micro_batch_size,
            pad_token_id=self._pad_token_id,
            device=torch.device("cpu"),
        )


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
        module = load_model(model_path, self.dims, layout, param_dtype=config.param_dtype)
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False)
        self.model = DistributedDataParallel(config=module.config, ddp_config=ddp_config, module=module)
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=config.schedule.lr_at(1),
            weight_decay=config.weight_decay,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
        )
        self.kl_controller = build_kl_controller(config.loss)
        self.num_optimizer_steps = 0
        self.num_updates = 0
        """Calls of ``update`` so far: seeds each update's mini-batch shuffle (checkpointed)."""
        self._step = _MegatronStep(self)

    def compute_log_probs(self, batch: TrainBatch, temperature: float) -> list[np.ndarray]:
        return compute_log_probs_megatron(
            self.model,
            self.dims,
            batch,
            temperature=temperature,
            micro_batch_size=self.config.forward_micro_batch_size,
            pad_token_id=self.config.pad_token_id,
            device=self._device,
        )

    @property
    def kl_coef(self) -> float:
        return self.kl_controller.value

    def observe_kl(self, kl: float, num_samples: int) -> None:
        self.kl_controller.update(kl, num_samples)

    def update(self, batch: TrainBatch, temperature: float) -> dict[str, float]:
        return run_update(self, self._step, batch, temperature)

    def snapshot_shard(self) -> tuple[dict[str, torch.Tensor], ShardCoords]:
        """This rank's weights in the training layout (global megatron names, this rank's shapes):
        what the rank writes into a snapshot for the GU's convert (``weights.megatron_rules``)."""
        coords = rank_coords(self.layout)
        return export_shard(_shard_weights(self.model.module), self.dims, coords), coords

    def named_weights_for_inference(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective: every rank must call it; rank 0 yields the whole model, the others nothing
        (a Training Unit group returns rank 0's result)."""
        yield from gather_hf_weights(self.model.module, self.dims, self.layout).items()

    def save_hf(self, path: str | os.PathLike[str]) -> None:
        weights = gather_hf_weights(self.model.module, self.dims, self.layout)
        if dist.get_rank() == 0:
            write_hf_folder(path, weights, self._source)
        dist.barrier()

    def policy_for_eval(self) -> PreTrainedModel | None:
        """An HF model of the current weights on rank 0 (collective: every rank sends its shards),
        None on the others. A full copy on one rank: fine for the CPU configs; large models would decode
        held-out prompts on the rollout engines instead (not built)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        from mindspeed_rl.models.training.hf_names import to_model_state

        weights = gather_hf_weights(self.model.module, self.dims, self.layout)
        if dist.get_rank() != 0:
            return None
        config = AutoConfig.from_pretrained(self._source)
        model = AutoModelForCausalLM.from_config(config, dtype=next(iter(weights.values())).dtype)
        model.load_state_dict(to_model_state(weights, model), strict=True)
        torch.nn.Module.to(model, self._device)
        return model

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
    (``finalize_model_grads``), loss sums reduced over every rank, and torch AdamW stepped on
    ``main_grad`` (the module docstring says why not megatron's optimizer here)."""

    def __init__(self, engine: MegatronTrainingEngine) -> None:
        self._engine = engine

    def zero_grad(self) -> None:
        self._engine.model.zero_grad_buffer()
        self._engine.optimizer.zero_grad(set_to_none=True)

    def forward_backward(self, loss: MiniBatchLoss) -> dict[str, float]:
        from megatron.core.distributed import finalize_model_grads

        engine = self._engine
        dp_rank, dp_size = _dp()
        micros = plan_micros(
            loss.mini,
            dp_rank=dp_rank,
            dp_size=dp_size,
            micro_batch_size=engine.config.micro_batch_size,
            pad_token_id=engine.config.pad_token_id,
            device=engine._device,
        )
        outputs = run_micros(engine.model, micros, partial(self._micro_loss, loss), forward_only=False)
        with patches.cpu_runtime_mode():
            finalize_model_grads([engine.model])
        sums = LossSums("cpu")
        if _reports_stats():
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
            return zero, torch.tensor(0), {name: zero.detach().reshape(1) for name in LOSS_TERMS}
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
        stats = {name: value.reshape(1) for name, value in loss_term_values(terms).items()}
        return terms.loss, torch.tensor(int(padded.response_mask.sum())), stats

    def apply_gradients(self, *, lr: float, max_norm: float) -> float:
        model, optimizer = self._engine.model, self._engine.optimizer
        norm = float(global_grad_norm(model.module.parameters()))
        if not np.isfinite(norm):
            raise ValueError(f"non-finite gradient norm {norm}; lower actor_config.lr or check the batch")
        # torch.nn.utils.clip_grad_norm_'s rule, so both engines clip identically.
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for p in model.module.parameters():
                if p.requires_grad:
                    p.main_grad.mul_(coef)
        for group in optimizer.param_groups:
            group["lr"] = lr
            for p in group["params"]:
                p.grad = p.main_grad.to(p.dtype)
        optimizer.step()
        return norm

    @property
    def lr(self) -> float:
        return float(self._engine.optimizer.param_groups[0]["lr"])


def global_grad_norm(params: Any) -> float:
    """L2 norm of every ``main_grad`` over the whole model, each shard counted once."""
    from megatron.core import parallel_state as ps

    dense = torch.zeros((), dtype=torch.float64)
    expert = torch.zeros((), dtype=torch.float64)
    tp_rank = ps.get_tensor_model_parallel_rank()
    etp_rank = ps.get_expert_tensor_parallel_rank()
    for p in params:
        # ``shared``: the last PP stage's copy of tied embeddings (its grad equals the first stage's).
        if not p.requires_grad or getattr(p, "shared", False):
            continue
        split = bool(getattr(p, "tensor_model_parallel", False))
        sq = p.main_grad.double().square().sum()
        if not getattr(p, "allreduce", True):  # megatron marks expert parameters allreduce=False
            if split or etp_rank == 0:
                expert += sq
        elif split or tp_rank == 0:
            dense += sq
    dist.all_reduce(dense, group=ps.get_model_parallel_group())
    dist.all_reduce(expert, group=ps.get_expert_tensor_model_pipeline_parallel_group())
    return float((dense + expert).sqrt())


def write_hf_folder(path: str | os.PathLike[str], weights: Mapping[str, torch.Tensor], source: Path) -> None:
    """safetensors weights + the source folder's config and tokenizer files."""
    from safetensors.torch import save_file

    target = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(target / "model.safetensors"))
    copy_non_weight_files(source, target)
