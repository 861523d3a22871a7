"""What each role of a run asks the cluster for: devices of one kind and CPUs per trainer rank,
generation actor and control actor (``utils.placement`` places the request on nodes). Part of
``run_plan``'s mapping; every refusal names the key and the fix. Torch-free.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from mindspeed_rl.config_cls.resources import ActorResources
from mindspeed_rl.utils.placement import DeviceKind, PlacementRequest, RoleRequest

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig


def placement_request(config: GRPOConfig) -> PlacementRequest:
    """Trainer ranks, generation actors and control actors, in devices of one kind and CPUs."""
    kind, reason = device_kind(config)
    trainer = trainer_ranks(config, kind)
    rl = config.rl_config
    if rl.pipeline == "hybrid":
        return PlacementRequest(
            device_kind=kind,
            device_kind_reason=reason,
            trainer=trainer,
            generation=hybrid_rollout(config, kind, trainer),
            actors_per_unit=None,
            colocated=kind is not None,
        )
    a = config.async_config
    size = a.actor_tensor_parallel_size * config.generate_config.infer_pipeline_parallel_size
    devices = whole_devices("async_config.actor_resources", a.actor_resources, kind)
    # 0 devices = generation actors on CPU beside an accelerator trainer; otherwise one per shard.
    if devices and devices != size:
        raise ValueError(
            f"async_config.actor_resources asks {devices} {kind} per generation actor but its layout "
            f"(actor_tensor_parallel_size x infer_pipeline_parallel_size) is {size}; ask for {size}"
        )
    if whole_devices("async_config.control_resources", a.control_resources, kind):
        raise ValueError(
            "async_config.control_resources: control actors run on CPU; remove its device request"
        )
    control = a.control_resources.num_cpus
    return PlacementRequest(
        device_kind=kind,
        device_kind_reason=reason,
        trainer=trainer,
        generation=RoleRequest(
            name="generation actor",
            count=a.num_generation_units * a.actors_per_unit,
            num_devices=devices,
            num_cpus=a.actor_resources.num_cpus,
        ),
        actors_per_unit=a.actors_per_unit,
        colocated=False,
        control=(
            RoleRequest(name="control unit", count=1, num_devices=0, num_cpus=control),
            RoleRequest(
                name="generation unit", count=a.num_generation_units, num_devices=0, num_cpus=control
            ),
        ),
    )


def device_kind(config: GRPOConfig) -> tuple[DeviceKind | None, str]:
    """NPU when a role of this pipeline asks ``num_npus``, GPU when ``num_gpus``, else CPU-only."""
    rl, a = config.rl_config, config.async_config
    roles = {"rl_config.actor_resource": rl.actor_resource}
    if rl.pipeline == "async":
        roles |= {
            "async_config.trainer_resources": a.trainer_resources,
            "async_config.actor_resources": a.actor_resources,
            "async_config.control_resources": a.control_resources,
        }
    npus = [k for k, r in roles.items() if r.num_npus > 0]
    gpus = [k for k, r in roles.items() if r.num_gpus > 0]
    if npus and gpus:
        raise ValueError(
            f"the config asks for NPUs ({', '.join(npus)}) and GPUs ({', '.join(gpus)}); "
            "a run uses one device kind: keep num_npus or num_gpus, not both"
        )
    if npus:
        return "NPU", f"num_npus in {', '.join(npus)}"
    if gpus:
        return "GPU", f"num_gpus in {', '.join(gpus)}"
    return None, "no num_npus / num_gpus in the config: a CPU-only run"


def whole_devices(where: str, r: ActorResources, kind: DeviceKind | None) -> int:
    amount = r.num_npus if kind == "NPU" else r.num_gpus if kind == "GPU" else 0.0
    if amount != int(amount):
        raise ValueError(
            f"{where}.num_{str(kind).lower()}s={amount:g}: placement hands out whole devices; use an integer"
        )
    return int(amount)


def trainer_ranks(config: GRPOConfig, kind: DeviceKind | None) -> RoleRequest:
    """The torch engine is one process (one rank holding its request). A Megatron layout
    (``use_mcore_models: true``) has one rank per device: upstream's group-wide
    ``rl_config.actor_resource.num_npus`` is the world size TP x PP x CP x DP."""
    rl = config.rl_config
    is_async = rl.pipeline == "async"
    per_rank = config.async_config.trainer_resources if is_async else rl.actor_resource
    if not config.actor_config.megatron_only.use_mcore_models:
        where = "async_config.trainer_resources" if is_async else "rl_config.actor_resource"
        return RoleRequest(
            name="trainer rank",
            count=1,
            num_devices=whole_devices(where, per_rank, kind),
            num_cpus=per_rank.num_cpus,
        )
    world = megatron_world_size(config, whole_devices("rl_config.actor_resource", rl.actor_resource, kind))
    return RoleRequest(
        name="trainer rank", count=world, num_devices=1 if kind else 0, num_cpus=per_rank.num_cpus
    )


def megatron_world_size(config: GRPOConfig, group_devices: int) -> int:
    """Ranks of the Megatron layout: the group's devices, or on CPU (gloo) the smallest layout
    whose data-parallel x context-parallel ranks hold the expert-parallel groups."""
    p = config.actor_config.parallel
    tp, pp, cp, ep = (
        p.tensor_model_parallel_size,
        p.pipeline_model_parallel_size,
        p.context_parallel_size,
        p.expert_model_parallel_size,
    )
    model = tp * pp * cp
    if group_devices == 0:
        return model * (ep // math.gcd(ep, cp))
    if group_devices % model or (group_devices // (tp * pp)) % ep:
        raise ValueError(
            f"rl_config.actor_resource asks {group_devices} devices for the trainer, one rank each, but "
            f"actor_config TP {tp} x PP {pp} x CP {cp} = {model} must divide it, and EP {ep} must divide "
            f"DP x CP = {group_devices // (tp * pp)}; change the device count or the layout"
        )
    return group_devices


def hybrid_rollout(config: GRPOConfig, kind: DeviceKind | None, trainer: RoleRequest) -> RoleRequest:
    """CPU: one generation actor beside the trainer (two processes). Accelerators: upstream's
    colocated hybrid, one rollout engine per infer TP x PP of the trainer's devices."""
    cpus = config.rl_config.actor_resource.num_cpus
    if kind is None:
        return RoleRequest(name="generation actor", count=1, num_devices=0, num_cpus=cpus)
    g = config.generate_config
    size = g.infer_tensor_parallel_size * g.infer_pipeline_parallel_size
    total = trainer.count * trainer.num_devices
    if total % size:
        raise ValueError(
            f"the trainer's {total} {kind}s cannot host rollout engines of generate_config "
            f"infer_tensor_parallel_size x infer_pipeline_parallel_size = {size}; make {size} divide {total}"
        )
    return RoleRequest(name="rollout engine", count=total // size, num_devices=size, num_cpus=cpus)
