"""GRPO training engine on megatron-core: one instance per rank of a TP/PP/EP/DP layout.

Same contract as the torch engine (:class:`~mindspeed_rl.models.training.base.TrainingEngine`):
every rank receives the whole batch and returns the same results. One ``update``::

    for each mini-batch (one optimizer step):
        DP rank d: its slice -> micro-batches -> forward_backward_func  (loss / global mini-batch count)
        finalize_model_grads: DP all-reduce (summed), q/k-norm grads over TP, tied embeddings over PP
        grad norm over TP/PP (+ EP for experts) -> clip -> AdamW.step() on main_grad

Optimizer, and why a torch one: megatron's ``get_megatron_optimizer`` allocates on "cuda" and its
distributed optimizer accepts only ``torch.cuda.*Tensor`` parameters, so it cannot run on a CPU
host. The engine therefore steps ``torch.optim.AdamW`` on megatron DDP's ``main_grad`` buffers;
with the per-rank shards and identical gradients on DP replicas this is the plain (non-sharded)
optimizer, exact in fp32. On accelerators the megatron distributed optimizer is the production
choice; it is not wired here because this machine cannot exercise it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from mindspeed_rl.models.loss.grpo import grpo_loss
from mindspeed_rl.models.loss.kl_control import build_kl_controller
from mindspeed_rl.models.training.batch import TrainBatch, check_update_batch, mini_batches
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
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

if TYPE_CHECKING:
    from transformers import PreTrainedModel

STEP_METRICS = ("loss", "pg_loss", "kl", "entropy", "clip_frac", "grad_norm")
_LOSS_TERMS = ("loss", "pg_loss", "kl", "entropy", "clip_frac")
_NON_WEIGHT_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")


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
        check_temperature(temperature)
        num_steps = check_update_batch(batch, self.config)
        minis = mini_batches(batch, self.config, update_index=self.num_updates)
        self.num_updates += 1
        kl_coef = self.kl_controller.value
        per_step = [self._optimizer_step(mini, temperature, kl_coef) for mini in minis]
        assert len(per_step) == num_steps
        metrics = {k: float(np.mean([m[k] for m in per_step])) for k in STEP_METRICS}
        metrics["lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics["num_optimizer_steps"] = float(num_steps)
        metrics["kl_coef"] = kl_coef
        if self.config.loss.kl_in_loss:
            self.kl_controller.update(metrics["kl"], batch.num_samples)
        return metrics

    def _loss_fn(
        self, mini: TrainBatch, temperature: float, kl_coef: float, micro: Micro, logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.config
        count = micro.indices.size
        if count == 0:  # a DP rank's filler micro-batch: same collectives, no loss
            zero = logits.sum() * 0.0
            return zero, torch.tensor(0), {name: zero.detach().reshape(1) for name in _LOSS_TERMS}
        padded = real_rows(micro.padded, count)
        logp, entropy = response_log_probs(
            logits[:count], padded, temperature, vocab_size=self.dims.vocab_size, with_entropy=True
        )
        assert entropy is not None
        if cfg.loss.entropy_coeff <= 0:
            entropy = entropy.detach()
        old = padded.old_log_probs if padded.old_log_probs is not None else logp.detach()
        terms = grpo_loss(
            log_probs=logp,
            old_log_probs=old,
            advantages=padded.advantages,
            mask=padded.response_mask,
            config=cfg.loss,
            # Counts of the WHOLE mini-batch (every rank has it): DP ranks' summed gradients are exact.
            num_tokens=mini.num_response_tokens,
            num_sequences=mini.num_samples,
            ref_log_probs=padded.ref_log_probs,
            entropy=entropy,
            kl_coef=kl_coef,
        )
        stats = {name: getattr(terms, name).detach().reshape(1) for name in _LOSS_TERMS}
        return terms.loss, torch.tensor(int(padded.response_mask.sum())), stats

    def _optimizer_step(self, mini: TrainBatch, temperature: float, kl_coef: float) -> dict[str, float]:
        from functools import partial

        from megatron.core.distributed import finalize_model_grads

        dp_rank, dp_size = _dp()
        micros = plan_micros(
            mini,
            dp_rank=dp_rank,
            dp_size=dp_size,
            micro_batch_size=self.config.micro_batch_size,
            pad_token_id=self.config.pad_token_id,
            device=self._device,
        )
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad(set_to_none=True)
        outputs = run_micros(
            self.model, micros, partial(self._loss_fn, mini, temperature, kl_coef), forward_only=False
        )
        with patches.cpu_runtime_mode():
            finalize_model_grads([self.model])
        sums = torch.zeros(len(_LOSS_TERMS), dtype=torch.float64)
        if _reports_stats():
            for out in outputs:
                sums += torch.cat([out[name].double() for name in _LOSS_TERMS])
        dist.all_reduce(sums)
        grad_norm = self._clip_main_grads()
        lr = self.config.schedule.lr_at(self.num_optimizer_steps + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
            for p in group["params"]:
                p.grad = p.main_grad.to(p.dtype)
        self.optimizer.step()
        self.num_optimizer_steps += 1
        result = {name: float(v) for name, v in zip(_LOSS_TERMS, sums.tolist())}
        result["grad_norm"] = grad_norm
        return result

    def _clip_main_grads(self) -> float:
        norm = float(global_grad_norm(self.model.module.parameters()))
        if not np.isfinite(norm):
            raise ValueError(f"non-finite gradient norm {norm}; lower actor_config.lr or check the batch")
        max_norm = self.config.clip_grad if self.config.clip_grad > 0 else float("inf")
        # torch.nn.utils.clip_grad_norm_'s rule, so both engines clip identically.
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for p in self.model.module.parameters():
                if p.requires_grad:
                    p.main_grad.mul_(coef)
        return norm

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
    if target.resolve() != source.resolve():
        for f in source.iterdir():
            copyable = f.is_file() and f.suffix in _NON_WEIGHT_SUFFIXES and ".safetensors" not in f.name
            if copyable and not (target / f.name).exists():
                shutil.copy2(f, target / f.name)
