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
of the default (NCCL/HCCL) group always receive device tensors. Python objects (log-probs by
sample, shard coordinates, RNG states) and weight shards bound for a host folder travel over a
gloo group of every rank instead (:func:`host_group`).

Optimizer. On an accelerator: megatron's ``get_megatron_optimizer`` (bf16 parameters with fp32
main parameters and fp32 Adam moments; the distributed optimizer shards them over DP when
``use_distributed_optimizer``). It allocates on "cuda" and its distributed optimizer accepts only
``torch.cuda.*Tensor`` parameters, so on a CPU host the engine steps the torch engine's
optimizers (``precision.py``: fp32 masters under bf16) on megatron DDP's ``main_grad`` instead.

Weights leave shard by shard (:meth:`MegatronTrainingEngine.save_hf` and the hybrid push): each
shard's first holder sends its snapshot-format shard to rank 0's host, tensor by tensor, and rank 0
merges them with the GU's rules (``hf_folder``, ``weights.megatron_rules``). No rank ever holds
another rank's shard on its device.
"""

from __future__ import annotations

import inspect
import os
import shutil
import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from mindspeed_rl.models.loss.kl_control import build_kl_controller
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.device import torch_dtype
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.hf_folder import (
    RankShardWriter,
    copy_non_weight_files,
    merge_plan,
    read_merged,
    write_merged,
    written_specs,
)
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
    export_shard,
    is_weight_name,
    load_dims,
)
from mindspeed_rl.models.training.megatron.layout import MegatronLayout
from mindspeed_rl.models.training.megatron.model import init_model_parallel, load_model, rank_coords
from mindspeed_rl.models.training.precision import AdamWSettings, ParamOptimizer, optimizer_for
from mindspeed_rl.models.training.update_loop import (
    LOSS_TERMS,
    LossSums,
    MiniBatchLoss,
    loss_term_values,
    run_update,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from mindspeed_rl.weights.convert import ConversionPlan
    from mindspeed_rl.weights.layout import TrainingLayout
    from mindspeed_rl.weights.manifest import ShardEntry, TensorEntry

HF_WEIGHTS_FILE = "model.safetensors"
_SHARD_STAGING = ".rank-shards"

_HOST_GROUP: dict[str, Any] = {}
"""The gloo group of :func:`ensure_host_group` (``group``) and the default group it was made
under (``world``): a re-initialised torch.distributed needs a new one."""


def ensure_host_group(device: torch.device) -> None:
    """Create the host group if this run needs one (collective: every rank calls it, once is
    enough). On a CPU run the default group is gloo already and serves as the host group."""
    if device.type == "cpu" or _HOST_GROUP.get("world") is dist.group.WORLD:
        return
    _HOST_GROUP.update(world=dist.group.WORLD, group=dist.new_group(backend="gloo"))


def host_group() -> Any:
    """The group for Python objects and host-side shard transfers: the gloo group of
    :func:`ensure_host_group`, or None (the default group) on a CPU run."""
    return _HOST_GROUP["group"] if _HOST_GROUP.get("world") is dist.group.WORLD else None


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
        one = torch.ones((), dtype=torch.int64, device=logits.device)
        return logits.sum() * 0.0, one, {"logp": logp.detach()}

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
            logp = out["logp"].cpu()
            for row, (i, r) in enumerate(zip(micro.indices, micro.batch.response_ids)):
                local[int(i)] = logp[row, : r.size].numpy().copy()
    gathered: list[dict[int, np.ndarray] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local, group=host_group())
    merged: dict[int, np.ndarray] = {}
    for part in gathered:
        merged.update(part or {})
    missing = sorted(set(range(batch.num_samples)) - set(merged))
    assert not missing, f"no rank scored samples {missing[:5]}"
    return [merged[i] for i in range(batch.num_samples)]


def layout_rank(coords: ShardCoords) -> int:
    """A rank's index in the snapshot layout (``weights.layout``'s numbering)."""
    return coords.tp_rank + coords.tp_size * (coords.ep_rank + coords.ep_size * coords.pp_rank)


def first_holders(all_coords: list[ShardCoords]) -> list[bool]:
    """Per global rank: whether it is the lowest rank holding its (tp, ep, pp) shard."""
    seen: set[int] = set()
    out = []
    for coords in all_coords:
        key = layout_rank(coords)
        out.append(key not in seen)
        seen.add(key)
    return out


def snapshot_layout(dims: GPTDims, coords: ShardCoords) -> TrainingLayout:
    """The manifest layout of this engine's shards (``weights.megatron_rules``)."""
    from mindspeed_rl.weights import megatron_rules

    return megatron_rules.training_layout(
        tp_size=coords.tp_size,
        pp_size=coords.pp_size,
        ep_size=coords.ep_size,
        expert_tensor_parallel_size=coords.etp_size,
        dims=dims,
    )


def load_model_in_dtype(
    model_path: str | os.PathLike[str], dims: GPTDims, layout: MegatronLayout, param_dtype: str
) -> Any:
    """This rank's stage with every parameter in ``param_dtype``.

    The local layer spec's norms are torch norms built without a dtype (``WrappedTorchNorm`` in
    megatron-core 0.12.1 and 0.19.2, transformer/torch_norm.py), so they come out fp32 under
    ``bf16: true``; megatron's own bf16 training casts the whole module (``Float16Module``:
    ``module.bfloat16()``, transformer/module.py), and so does this. TransformerEngine's norms
    already have ``params_dtype``.
    """
    module = load_model(model_path, dims, layout, param_dtype=param_dtype)
    return module.to(torch_dtype(param_dtype))


def _weight_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's weights as they are (on the device, no copy)."""
    return {
        name: t.detach()
        for name, t in model.state_dict().items()
        if is_weight_name(name) and isinstance(t, torch.Tensor)
    }


class ShardCollector:
    """Brings every shard's first holder's snapshot-format shard to rank 0's host (collective).

    Writers send over the host group one tensor at a time (names, shapes and dtypes first), and
    rank 0 writes each into a rank shard file as it arrives, so neither side holds more than its
    own shard plus one tensor; nothing of another rank ever reaches a device.
    """

    def __init__(self, dims: GPTDims, layout: MegatronLayout) -> None:
        self._dims = dims
        self._coords = rank_coords(layout)
        gathered: list[ShardCoords | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self._coords, group=host_group())
        holders = first_holders([c for c in gathered if c is not None])
        self.writers: list[int | None] = [
            layout_rank(c) if first and c is not None else None
            for c, first in zip(gathered, holders, strict=True)
        ]
        """Per global rank: the layout rank whose shard it writes, or None (a DP replica)."""
        self.layout = snapshot_layout(dims, self._coords)

    def _mine(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        rank = self.writers[dist.get_rank()]
        assert rank is not None
        exported = export_shard(_weight_tensors(model), self._dims, self._coords)
        return {name: exported[name] for name in written_specs(self.layout, rank, exported)}

    def collect(self, model: torch.nn.Module, folder: Path | None) -> ConversionPlan | None:
        """Rank 0: writes every shard into ``folder`` and returns the merge plan; others: send
        their shard (if they write one) and return None. ``model``: anything whose
        ``state_dict()`` holds megatron-named tensors of this rank."""
        group = host_group()
        me = dist.get_rank()
        if me != 0:
            if self.writers[me] is not None:
                tensors = self._mine(model)
                meta = [(name, tuple(t.shape), t.dtype) for name, t in tensors.items()]
                dist.send_object_list([meta], dst=0, group=host_group())
                for t in tensors.values():
                    dist.send(t.cpu().contiguous(), dst=0, group=group)
            return None
        assert folder is not None
        folder.mkdir(parents=True, exist_ok=True)
        shards: list[ShardEntry] = []
        entries: list[TensorEntry] = []
        for src, rank in enumerate(self.writers):
            if rank is None:
                continue
            if src == 0:
                own = self._mine(model)
                writer = RankShardWriter(folder, self.layout, rank, own)
                for name, t in own.items():
                    writer.write(name, t.cpu())
            else:
                received: list[Any] = [None]
                dist.recv_object_list(received, src=src, group=host_group())
                planned = {n: torch.empty(s, dtype=d, device="meta") for n, s, d in received[0]}
                writer = RankShardWriter(folder, self.layout, rank, planned)
                for name, t in planned.items():
                    buffer = torch.empty(t.shape, dtype=t.dtype)
                    dist.recv(buffer, src=src, group=group)
                    writer.write(name, buffer)
            shard, written = writer.finish()
            shards.append(shard)
            entries.extend(written)
        return merge_plan(self.layout, shards, entries)


def gather_hf_weights(
    model: torch.nn.Module, dims: GPTDims, layout: MegatronLayout, *, collector: ShardCollector | None = None
) -> dict[str, torch.Tensor]:
    """The full HF-named tensors of ``model``'s shards on rank 0's host, ``{}`` on the other ranks
    (collective): the hybrid push, evaluation and checks. Shards reach rank 0 through a
    temporary folder of its own (:class:`ShardCollector`; pass one to spare its coordinate
    exchange)."""
    collector = collector or ShardCollector(dims, layout)
    if dist.get_rank() != 0:
        collector.collect(model, None)
        return {}
    with tempfile.TemporaryDirectory(prefix="mcore-hf-") as tmp:
        plan = collector.collect(model, Path(tmp))
        assert plan is not None
        return read_merged(Path(tmp), plan)


class MegatronReferenceModel:
    """The frozen initial policy, sharded like the trained one (same layout, no DDP, no grads), in
    the policy's parameter dtype and on its device: the reference is never trained, so an fp32
    copy of a bf16 policy would double its memory for nothing."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        layout: MegatronLayout,
        *,
        micro_batch_size: int,
        pad_token_id: int = 0,
        seed: int = 1,
        device: str = "cpu",
        param_dtype: str = "float32",
    ) -> None:
        init_model_parallel(layout, seed)
        self._device = torch.device(device)
        ensure_host_group(self._device)
        self.dims = load_dims(model_path)
        self._model = load_model_in_dtype(model_path, self.dims, layout, param_dtype)
        self._model.requires_grad_(False)
        self._micro_batch_size = micro_batch_size
        self._pad_token_id = pad_token_id

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    def compute_log_probs(self, batch: TrainBatch, temperature: float) -> list[np.ndarray]:
        return compute_log_probs_megatron(
            self._model,
            self.dims,
            batch,
            temperature=temperature,
            micro_batch_size=self._micro_batch_size,
            pad_token_id=self._pad_token_id,
            device=self._device,
        )


def uses_megatron_optimizer() -> bool:
    """Megatron's optimizer on an accelerator; the torch optimizers on a CPU host (module docstring)."""
    return patches.device_kind() != "cpu"


def ddp_config_kwargs(config: TorchEngineConfig, *, megatron_optimizer: bool) -> dict[str, Any]:
    """``DistributedDataParallelConfig`` fields (present in megatron-core 0.12.1 and 0.19.2,
    distributed/distributed_data_parallel_config.py).

    ``grad_reduce_in_fp32``: upstream's ``accumulate_allreduce_grads_in_fp32`` (default off: the
    buffer has the parameters' dtype). The distributed optimizer needs DDP's reduce-scatter, so
    the two switch together; the CPU path steps whole shards and keeps the all-reduce.
    """
    return {
        "grad_reduce_in_fp32": config.accumulate_allreduce_grads_in_fp32,
        "overlap_grad_reduce": False,
        "use_distributed_optimizer": megatron_optimizer and config.use_distributed_optimizer,
    }


def megatron_optimizer_config_kwargs(config: TorchEngineConfig) -> dict[str, Any]:
    """``OptimizerConfig`` fields, each present under this name in megatron-core 0.12.1 and 0.19.2
    (optimizer/optimizer_config.py). The learning rate is set on the parameter groups every step
    (``_MegatronStep.apply_gradients``); ``lr`` here is only the first step's.

    ``clip_grad`` 0 (no clipping) becomes inf: megatron then still computes and returns the norm
    (``clip_coeff = max_norm / (norm + 1e-6)`` is never below 1), where 0 would skip the norm.
    """
    return {
        "optimizer": "adam",
        "lr": config.schedule.lr_at(1),
        "weight_decay": config.weight_decay,
        "adam_beta1": config.adam_beta1,
        "adam_beta2": config.adam_beta2,
        "adam_eps": config.adam_eps,
        "clip_grad": config.clip_grad if config.clip_grad > 0 else float("inf"),
        "bf16": config.param_dtype == "bfloat16",
        "fp16": False,
        "params_dtype": torch_dtype(config.param_dtype),
        "use_distributed_optimizer": config.use_distributed_optimizer,
    }


def _decays(name: str, param: torch.nn.Parameter) -> bool:
    return False  # megatron-core 0.12.1's no_weight_decay_cond: no parameter is exempt


def build_megatron_optimizer(
    config: TorchEngineConfig, model: torch.nn.Module, *, get_optimizer: Any = None
) -> Any:
    """megatron's optimizer over the DDP-wrapped ``model`` (``get_optimizer``: a stand-in for
    ``get_megatron_optimizer``, for tests).

    Every parameter decays, biases and norms included, as in the torch engine and this engine's
    CPU path (megatron's default exempts them): megatron-core 0.19.2 takes ``config_overrides={}``
    for that (None would apply its standard wd_mult 0 overrides), 0.12.1 a
    ``no_weight_decay_cond`` that exempts nothing.
    """
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    factory = get_optimizer or get_megatron_optimizer
    accepted = inspect.signature(factory).parameters
    extra: dict[str, Any] = {}
    if "config_overrides" in accepted:
        extra["config_overrides"] = {}
    elif "no_weight_decay_cond" in accepted:
        extra["no_weight_decay_cond"] = _decays
    return factory(OptimizerConfig(**megatron_optimizer_config_kwargs(config)), [model], **extra)


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

    @property
    def device(self) -> torch.device:
        return self._device

    def new_host_optimizer(self) -> ParamOptimizer:
        """The CPU path's optimizer (``precision.py``), over this rank's trainable parameters: fp32
        masters of bf16 ones. Rebuilt after weights are loaded, since the masters copy them."""
        config = self.config
        return optimizer_for(
            [p for p in self.model.module.parameters() if p.requires_grad],
            AdamWSettings(
                lr=config.schedule.lr_at(1),
                weight_decay=config.weight_decay,
                betas=(config.adam_beta1, config.adam_beta2),
                eps=config.adam_eps,
            ),
        )

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
        """This rank's weights in the training layout (global megatron names, this rank's shapes),
        copied to host: what the rank writes into a snapshot for the GU's convert."""
        coords = rank_coords(self.layout)
        host = {name: t.cpu() for name, t in _weight_tensors(self.model.module).items()}
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

    def save_hf(self, path: str | os.PathLike[str]) -> None:
        """An HF folder (one ``model.safetensors`` + the source's config and tokenizer), written by
        rank 0 from every shard, merged on its host one tensor group at a time."""
        target = Path(path)
        staging = target / _SHARD_STAGING
        plan = self._shards().collect(self.model.module, staging if dist.get_rank() == 0 else None)
        if plan is not None:
            write_merged(staging, plan, target / HF_WEIGHTS_FILE)
            shutil.rmtree(staging)
            copy_non_weight_files(self._source, target)
        dist.barrier(group=host_group())

    def policy_for_eval(self) -> PreTrainedModel | None:
        """An HF model of the current weights on rank 0 (collective: the shards reach rank 0's host
        as for the hybrid push, never a device), None on the others. A full copy on one rank: fine
        for the CPU configs; large models would decode held-out prompts on the rollout engines
        instead (not built)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        from mindspeed_rl.models.training.hf_names import to_model_state

        weights = dict(self.named_weights_for_inference())
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
    (``finalize_model_grads``), loss sums on the device reduced over every rank, then megatron's
    optimizer or, on a CPU host, the torch optimizers on ``main_grad`` (module docstring)."""

    def __init__(self, engine: MegatronTrainingEngine) -> None:
        self._engine = engine

    def zero_grad(self) -> None:
        self._engine.model.zero_grad_buffer()
        self._engine.optimizer.zero_grad()

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
            device=engine.device,
        )
        outputs = run_micros(engine.model, micros, partial(self._micro_loss, loss), forward_only=False)
        with patches.cpu_runtime_mode():
            finalize_model_grads([engine.model])
        sums = LossSums(engine.device)
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
        stats = {name: value.reshape(1) for name, value in loss_term_values(terms).items()}
        return terms.loss, padded.response_mask.sum().to(torch.int64), stats

    def apply_gradients(self, *, lr: float, max_norm: float) -> float:
        if self._engine.megatron_optimizer:
            return self._megatron_step(lr)
        model, optimizer = self._engine.model, self._engine.optimizer
        params = optimizer.params
        norm = global_grad_norm(params, device=self._engine.device)
        if not np.isfinite(norm):
            raise ValueError(f"non-finite gradient norm {norm}; lower actor_config.lr or check the batch")
        # torch.nn.utils.clip_grad_norm_'s rule (megatron's too), so the engines clip identically.
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for p in model.module.parameters():
                if p.requires_grad:
                    p.main_grad.mul_(coef)
        optimizer.take_grads([p.main_grad for p in params])
        optimizer.step(lr)
        return norm

    def _megatron_step(self, lr: float) -> float:
        # What megatron's OptimizerParamScheduler.step does to each group (0.12.1 and 0.19.2,
        # optimizer_param_scheduler.py): the multipliers megatron's param groups carry.
        engine = self._engine
        for group in engine.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)
            group["weight_decay"] = engine.config.weight_decay * group.get("wd_mult", 1.0)
        # (success, grad_norm, num_zeros_in_grad) in 0.12.1 and 0.19.2 (optimizer/optimizer.py).
        success, grad_norm, _ = engine.optimizer.step()
        norm = float("nan") if grad_norm is None else float(grad_norm)
        if not success or not np.isfinite(norm):
            raise ValueError(
                f"megatron's optimizer skipped the step (success={success}, gradient norm {norm}); lower "
                "actor_config.lr or check the batch"
            )
        return norm

    @property
    def lr(self) -> float:
        optimizer = self._engine.optimizer
        return float(optimizer.param_groups[0]["lr"]) if self._engine.megatron_optimizer else optimizer.lr


def global_grad_norm(params: Any, *, device: torch.device | str = "cpu") -> float:
    """L2 norm of every ``main_grad`` over the whole model, each shard counted once; the partial
    sums live on ``device`` (the engine's), where the model-parallel all-reduces run."""
    from megatron.core import parallel_state as ps

    dense = torch.zeros((), dtype=torch.float64, device=device)
    expert = torch.zeros((), dtype=torch.float64, device=device)
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
