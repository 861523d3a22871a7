"""``async_config``: the asynchronous TU/GU/CU pipeline (used when rl_config.pipeline = async)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mindspeed_rl.config_cls.fields import opt, section
from mindspeed_rl.config_cls.resources import ActorResources
from mindspeed_rl.config_cls.role_envs import RoleEnvsConfig
from mindspeed_rl.runtime.config import ControlKnobs

WeightTransport = Literal["shared_fs", "object_store", "collective"]
"""``async_config.weight_transport``: carried as this type to the workers; each name is one module
of ``weights/transports/`` (``transport_for`` turns the name into its code, nowhere else)."""
DEFAULT_WEIGHT_TRANSPORT: WeightTransport = "shared_fs"


@dataclass(frozen=True, slots=True, kw_only=True)
class AsyncConfig(ControlKnobs):
    """Generation units, the weight flow and, inherited from ``ControlKnobs`` (defaults and docs
    defined once, with the Control Unit's settings), the queue, backpressure, lag and fault knobs.
    Queue sizes state their units."""

    num_generation_units: int = opt(1, "Generation Units (GUs), each with its control process.")
    actors_per_unit: int = opt(1, "Generation actors (rollout engines) per GU.")
    actor_tensor_parallel_size: int = opt(1, "TP of each generation actor.")
    actor_expert_parallel_size: int = opt(1, "EP of each generation actor (MoE).")
    actor_resources: ActorResources = section(ActorResources, "Ray request of each generation actor.")
    trainer_resources: ActorResources = section(
        ActorResources, "Ray request of each Training Unit worker (torch backend: one worker)."
    )
    control_resources: ActorResources = section(
        ActorResources, "Ray request of each control actor (GU control process, Training Queue)."
    )
    snapshot_dir: str | None = opt(
        None,
        "Snapshot folder (shared by TU and GUs); each run writes under <snapshot_dir>/<run dir name>/, "
        "so reruns into one folder never prune each other's versions; null = <run_dir>/snapshots.",
    )
    snapshot_keep: int = opt(3, "Snapshots kept; older ones are deleted (>= 2 so a loading one survives).")
    weight_transport: WeightTransport = opt(
        DEFAULT_WEIGHT_TRANSPORT,
        "shared_fs = snapshot files in snapshot_dir (every node must see it; checked at start); "
        "object_store = Ray's object store (no shared disk); collective = one process group per GU "
        "(its backend: collective_backend), bucketed sends (no shared disk).",
    )
    collective_backend: Literal["auto", "gloo", "nccl", "hccl"] = opt(
        "auto",
        "weight_transport=collective: the GU groups' backend. auto = by device kind (nccl on GPU runs, "
        "hccl on NPU runs, gloo on CPU-only runs); gloo = host memory over TCP on any run; nccl / hccl "
        "= from the TU ranks' devices to the device of each GU's first generation actor (that actor's "
        "device then also holds one round of receive buckets: bucket_mb per sending TU rank). "
        "nccl / hccl are refused on a run without that device kind.",
    )
    bucket_mb: float = opt(
        512.0,
        "weight_transport=collective: bytes per send bucket, in MB (a larger tensor goes alone). "
        "A GU holds about 3 rounds of buckets (one per sending TU rank each) while it receives; "
        "a model of fewer than ~8 buckets per rank gains little from the receive/convert overlap.",
    )
    weight_delta: Literal["off", "auto", "on"] = opt(
        "off",
        "Delta weight sync: off = every refresh carries the whole model; on = a refresh carries, per "
        "tensor, only the elements whose bits changed since the receiver's version (checked bit for bit "
        "after applying); auto = a delta only when it is under half the full bytes. Wired for every "
        "weight_transport (weights/delta_fs.py, delta_object_store.py, delta_collective.py; "
        "guides/weight-delta.md).",
    )
    delta_full_interval: int = opt(
        10,
        "weight_delta auto / on: a full snapshot every N versions (and whenever a receiver's base is "
        "unknown, missing or corrupt).",
    )
    role_envs: RoleEnvsConfig | None = opt(
        None,
        "One Python environment per role: {trainer: {python: ...}, rollout: {python: ...}} "
        "(config_cls/role_envs.py); null = every actor in the environment Ray was started from.",
    )
