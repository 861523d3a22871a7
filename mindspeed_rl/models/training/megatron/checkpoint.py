"""The megatron engine's resumable state as megatron-core's distributed checkpoint.

Inside one ``<save>/iter_N/`` folder (``trainer/checkpointing.py`` owns the folder and its
atomic commit)::

    config.json, model.safetensors ...   HF folder of the weights (rank 0, merged from every rank's
                                         shard, ``engine.save_hf``): what the
                                         rollout actors of a resumed run load, and what users read
    mcore_dist/                          megatron ``dist_checkpointing`` (torch_dist): model weights
                                         and AdamW moments as ShardedTensors, each shard written once
                                         by its first holder, in global (un-sharded) coordinates
    trainer_state.pt                     rank 0: step counts, KL coefficient, the saved layout, every
                                         rank's RNG state (models/training/trainer_state.py)

Why global coordinates matter: a checkpoint saved at TP2 loads at TP1/DP2 (or any other layout
of the same model), since ``dist_checkpointing.load`` reassembles each rank's new shard from the
saved pieces. Only the RNG states are per rank: they are restored when the layout is the same,
and a different layout needs ``no_load_rng``.

Optimizer state. On a CPU host the optimizer is torch's AdamW (``engine.py`` says why), over the
parameters or, under bf16, over their fp32 masters: its per-parameter moments and the masters
themselves (``optimizer.state.fp32_param``; masters rebuilt from the bf16 weights would lose what
they hold below a bf16 ulp) are sharded exactly like their parameters. Its ``step``
counter is the same for every parameter (every parameter steps every time), so it is stored once
as ``num_optimizer_steps`` rather than as a tensor per parameter. On an accelerator megatron's
optimizer writes its own sharded state (``sharded_state_dict``: main parameters and moments,
resharded over DP by the distributed optimizer).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from mindspeed_rl.models.training import trainer_state
from mindspeed_rl.models.training.megatron import patches
from mindspeed_rl.models.training.megatron.groups import host_group
from mindspeed_rl.models.training.update_loop import progress_state, restore_progress

if TYPE_CHECKING:
    from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
    from mindspeed_rl.models.training.megatron.layout import MegatronLayout

DIST_DIR = "mcore_dist"
_ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")
_MASTER = "fp32_param"
"""The state key of a bf16 parameter's fp32 master (megatron's own name for it)."""


def _optimizer_params(optimizer: torch.optim.Optimizer) -> Iterator[torch.nn.Parameter]:
    for group in optimizer.param_groups:
        yield from group["params"]


def _ensure_adam_state(optimizer: torch.optim.Optimizer, num_steps: int) -> None:
    """Give every parameter AdamW state tensors (zeros before the first step), so the sharded
    dict has one entry per parameter whether or not a step ran."""
    for p in _optimizer_params(optimizer):
        state = optimizer.state[p]
        for key in _ADAM_MOMENTS:
            if key not in state:
                state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] = torch.tensor(float(num_steps))


def _host_optimizer_state(engine: MegatronTrainingEngine) -> dict[str, Any]:
    """The torch AdamW's state dict, ids in the order of ``engine.optimizer.params`` (the model's
    parameters), plus each bf16 parameter's fp32 master under :data:`_MASTER`."""
    host = engine.optimizer
    inner = host.torch_optimizer
    _ensure_adam_state(inner, engine.num_optimizer_steps)
    state = inner.state_dict()
    # state_dict() shares each parameter's state dict with the optimizer: copy before adding to it.
    state["state"] = {param_id: dict(entry) for param_id, entry in state["state"].items()}
    masters = host.master_params
    if masters is not None:
        for param_id, master in enumerate(masters):
            state["state"][param_id][_MASTER] = master.detach()
    return state


DIST_OPTIM_FORMAT = "dp_reshardable"
"""The distributed optimizer's checkpoint format where megatron-core takes ``metadata`` (0.19.2):
its shards as saved, resharded over another data-parallel size on load (Megatron-LM's own default
when ``--dist-ckpt-optim-fully-reshardable`` is off). Not 0.19.2's ``sharded_state_dict`` default,
``fully_sharded_model_space``: that builds ShardedTensors with a ``flattened_range``, which
0.19.2's ``ShardedTensor.validate_metadata_integrity`` refuses ("ShardedTensor.flattened_range is
not supported"), so a save with the default fails on the first checkpoint (found by
``benchmarks/device_check.py``'s checkpoint stage on an H100)."""


def _takes_metadata() -> bool:
    """megatron-core 0.19.2's ``DistributedOptimizer.sharded_state_dict`` selects its format by
    ``metadata["distrib_optim_sharding_type"]`` (its ``sharding_type`` argument is deprecated);
    0.12.1's has only ``sharding_type``, defaulting to a ``fully_sharded_model_space`` that works
    there."""
    import inspect

    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    return "metadata" in inspect.signature(DistributedOptimizer.sharded_state_dict).parameters


def optimizer_sharding(layout: MegatronLayout) -> dict[str, Any]:
    """Extra arguments of megatron's optimizer ``sharded_state_dict`` for ``layout`` (the same at
    save and load: the format is part of the checkpoint).

    MindSpeed's swap optimizer (26.1.0_core_r0.12.1, ``SwapDistributedOptimizer``) keeps the fp32
    masters and moments in host buffers between steps, their device tensors without storage, and
    overrides only megatron's ``dp_zero_gather_scatter`` path (``get_parameter_state_dp_zero``,
    ``load_parameter_state_from_dp_zero``), which reads those host buffers. megatron-core 0.12.1's
    default, ``fully_sharded_model_space``, would read the empty device tensors, so a swapping
    layout asks for ``dp_zero_gather_scatter`` (``DistributedOptimizer.sharded_state_dict``'s
    ``sharding_type``; ``ChainedOptimizer`` passes it to each). That format gathers the state on
    data-parallel rank 0; not run on an Ascend host here. Otherwise, on a megatron-core that takes
    ``metadata``, :data:`DIST_OPTIM_FORMAT`; the non-distributed optimizers of 0.19.2 accept the
    same ``metadata`` and ignore the key."""
    if layout.swap_optimizer:
        return {"sharding_type": "dp_zero_gather_scatter"}
    if _takes_metadata():
        return {"metadata": {"distrib_optim_sharding_type": DIST_OPTIM_FORMAT}}
    return {}


def sharded_state(
    engine: MegatronTrainingEngine, *, optimizer: bool, is_loading: bool = False
) -> dict[str, Any]:
    """The model's sharded state dict (and the optimizer's state sharded like the parameters)."""
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    model_state = engine.model.module.sharded_state_dict()
    state: dict[str, Any] = {"model": model_state}
    if not optimizer:
        return state
    if engine.megatron_optimizer:
        # megatron's optimizers: sharded_state_dict(model_sharded_state_dict, is_loading) in
        # 0.12.1 and 0.19.2 (optimizer/optimizer.py, distrib_optimizer.py); not run on this host.
        # A distributed optimizer reshards over another DP size with its default sharding type.
        state["optimizer"] = engine.optimizer.sharded_state_dict(
            model_state, is_loading=is_loading, **optimizer_sharding(engine.layout)
        )
        return state
    optim_state = _host_optimizer_state(engine)
    # The AdamW's state ids are positions in ``params``: map them to the model's sharded tensors.
    id_map = get_param_id_to_sharded_param_map(model_state, engine.optimizer.params)
    optim_state_to_sharding_state(optim_state, id_map, exclude_keys=("step",))
    state["optimizer"] = optim_state
    return state


def save(engine: MegatronTrainingEngine, path: str | os.PathLike[str], *, optimizer: bool, rng: bool) -> None:
    """Collective: every rank calls it with the same ``path`` (a folder the caller created)."""
    from megatron.core import dist_checkpointing

    target = Path(path)
    engine.save_hf(target)
    dist_dir = target / DIST_DIR
    if dist.get_rank() == 0:
        dist_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier(group=host_group())
    patches.in_process_checkpoint_results()
    with patches.cpu_runtime_mode():
        dist_checkpointing.save(sharded_state(engine, optimizer=optimizer), str(dist_dir))
    rng_states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rng_states, trainer_state.capture_rng() if rng else None, group=host_group())
    if dist.get_rank() == 0:
        trainer_state.save_trainer_state(
            target,
            {
                **progress_state(engine),
                "optimizer": DIST_DIR if optimizer else None,
                "layout": engine.layout_key(),
                "rng": rng_states if rng else None,
            },
        )
    dist.barrier(group=host_group())


def load(engine: MegatronTrainingEngine, path: str | os.PathLike[str], *, optimizer: bool, rng: bool) -> None:
    """Collective: restore ``save``'s state into ``engine`` (built from the same model, any layout)."""
    from megatron.core import dist_checkpointing

    source = Path(path)
    state = trainer_state.load_trainer_state(source)
    _check_loadable(state, source, engine, optimizer=optimizer, rng=rng)
    # First: the AdamW state this run builds to receive the saved moments carries the step count.
    restore_progress(engine, state)
    if optimizer and engine.megatron_optimizer:
        prime_empty_torch_adam(engine.optimizer)
    with patches.cpu_runtime_mode():
        loaded = dist_checkpointing.load(
            sharded_state(engine, optimizer=optimizer, is_loading=True),
            str(source / DIST_DIR),
            strict="assume_ok_unexpected",
        )
    engine.model.module.load_state_dict(loaded["model"], strict=True)
    if engine.megatron_optimizer:
        _load_megatron_optimizer(engine, loaded.get("optimizer"))
    else:
        _load_host_optimizer(engine, loaded["optimizer"] if optimizer else None)
    if rng:
        trainer_state.restore_rng(state["rng"][dist.get_rank()])
    dist.barrier(group=host_group())


def _load_host_optimizer(engine: MegatronTrainingEngine, saved: dict[str, Any] | None) -> None:
    """A fresh optimizer over the loaded weights (bf16 masters copy them), then the saved moments
    and masters into it; ``saved`` None (no_load_optim): fresh moments, masters = the weights."""
    engine.optimizer = engine.new_host_optimizer()
    if saved is None:
        return
    host = engine.optimizer
    inner = host.torch_optimizer
    fresh = inner.state_dict()  # param ids and hyper-parameters of this run
    masters = host.master_params
    with torch.no_grad():
        for param_id, moments in saved["state"].items():
            master = moments.pop(_MASTER, None)
            if masters is not None:
                if master is None:
                    raise ValueError(
                        "the checkpoint's optimizer state has no fp32 master weights (it was saved by an "
                        "fp32 run); resume with bf16: false, or set actor_config.no_load_optim: true"
                    )
                masters[param_id].copy_(master)
                host.params[param_id].copy_(master)
            moments["step"] = torch.tensor(float(engine.num_optimizer_steps))
            fresh["state"][param_id] = moments
    inner.load_state_dict(fresh)


def prime_empty_torch_adam(optimizer: Any) -> int:
    """Give every parameter of megatron's torch Adam/AdamW (the optimizer it falls back to without
    Transformer Engine or Apex) the state torch would create on its first step: ``step`` 0 and zero
    moments. Returns how many parameters it primed.

    Why: megatron-core 0.19.2's ``DistributedOptimizer.sharded_state_dict`` calls ``state_dict()``
    before it loads, and without TE/Apex ``state_dict()`` asserts that the torch optimizer's state
    holds exactly one step value (``assert len(steps) == 1``, distrib_optimizer.py): a fresh
    optimizer has none, so resuming into a run that has not stepped yet fails (found on an H100 by
    ``benchmarks/device_check.py``'s checkpoint stage). The primed values change nothing: the load
    overwrites the moments, the fp32 main parameters and the step, and a step from the primed state
    equals a step from the empty one (torch initialises exactly these). Optimizers that are not
    torch's own (TE's or Apex's fused Adam, with their own state layout) are left alone."""
    primed = 0
    chain = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    for wrapper in chain:
        inner = getattr(wrapper, "optimizer", None)
        if not isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            continue
        for group in inner.param_groups:
            on_device = bool(group.get("fused") or group.get("capturable"))
            for param in group["params"]:
                state = inner.state[param]
                if state:
                    continue
                # torch.optim.adam._init_group's initial state (torch 2.11 and 2.13): a float32
                # step, on the parameter's device only when fused or capturable.
                state["step"] = (
                    torch.zeros((), dtype=torch.float32, device=param.device)
                    if on_device
                    else torch.tensor(0.0, dtype=torch.float32)
                )
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                if group.get("amsgrad"):
                    state["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                primed += 1
    return primed


def _load_megatron_optimizer(engine: MegatronTrainingEngine, saved: dict[str, Any] | None) -> None:
    """megatron's optimizer (0.12.1 and 0.19.2: ``load_state_dict`` of ``sharded_state_dict``'s
    loaded form; ``reload_model_params`` re-copies the weights into its fp32 main parameters)."""
    if saved is None:
        engine.optimizer.reload_model_params()
        return
    engine.optimizer.load_state_dict(saved)


def _check_loadable(
    state: dict[str, Any], source: Path, engine: MegatronTrainingEngine, *, optimizer: bool, rng: bool
) -> None:
    trainer_state.check_loadable(state, source, engine="megatron", optimizer=optimizer, rng=rng)
    if rng and state["layout"] != engine.layout_key():
        raise ValueError(
            f"{source} was saved with trainer layout {state['layout']}, this run uses {engine.layout_key()}: "
            "weights and optimizer reshard, per-rank RNG states do not; set actor_config.no_load_rng: true"
        )
