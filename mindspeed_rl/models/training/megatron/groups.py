"""The process groups and rank roles the megatron engine's collectives use.

Device tensors go over the default (NCCL/HCCL) group; Python objects (log-probs by sample, shard
coordinates, RNG states) and weight shards bound for a host folder go over a gloo group of every
rank instead (:func:`host_group`), so no collective of the default group ever sees a host object.
The DP slot and the reporting rank come from megatron's parallel state (imported on first use).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

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


def dp_rank_size() -> tuple[int, int]:
    """This rank's data-parallel rank and the DP size."""
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()


def reports_stats() -> bool:
    """One rank per DP replica reports loss terms (the last stage's TP rank 0, CP rank 0: the CP
    ranks of a replica hold the same, CP-summed, log-probs and loss)."""
    from megatron.core import parallel_state as ps

    return (
        ps.is_pipeline_last_stage()
        and ps.get_tensor_model_parallel_rank() == 0
        and ps.get_context_parallel_rank() == 0
    )
