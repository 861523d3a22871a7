"""The placement dry run's check of a colocated megatron hybrid: its real rank group (the
hybrid's group spec, ``ColocatedGroup``, the rendezvous) started with a probe in each rank in
place of the trainer shard and engine rank, reporting where every rank landed and which engine
and TP rank it joins (``check_config --placement-dry-run``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mindspeed_rl.utils.placement_dry_run import READY_TIMEOUT_S, Placeholder
from mindspeed_rl.workers.colocated_rank import ColocatedGroup, EngineGrid, rank_group_spec

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import ActorResources
    from mindspeed_rl.contracts import RolloutSpec, TrainerSpec
    from mindspeed_rl.utils.placement import Placement


class RankProbe:
    """A colocated rank group's stand-in target: where the rank landed and which engine it joins."""

    def __init__(self, kind: str, grid: Any) -> None:
        import torch.distributed as dist

        self._kind, self._rank, self._world = kind, dist.get_rank(), dist.get_world_size()
        self._engine = grid.of_rank(self._rank)

    def report(self) -> dict[str, Any]:
        entry = Placeholder().report(self._kind)
        engine, tp_rank = self._engine
        return {**entry, "rank": self._rank, "world_size": self._world, "engine": engine, "tp_rank": tp_rank}


def rank_group(
    trainer: TrainerSpec, resources: ActorResources, rollout: RolloutSpec, placement: Placement
) -> dict[str, Any]:
    """Reserve ``placement``, start the colocated hybrid's rank group with probe ranks (gloo: the
    probes run no device collective), report every rank, release. ``resources``: the plan's
    ``trainer_resources``."""
    import dataclasses
    import functools

    import ray

    from mindspeed_rl.utils.ray_setup import reserve

    kind = placement.request.device_kind
    if kind is None:
        raise ValueError("a CPU-only run has no device placement to dry-run")
    grid = EngineGrid.of(trainer.num_ranks, rollout)
    grid.check_placement(placement)
    reserved = reserve(placement, timeout_s=READY_TIMEOUT_S)
    try:
        spec = dataclasses.replace(rank_group_spec(trainer, resources, reserved), backend="gloo")
        actor: Any = ray.remote(ColocatedGroup)
        group = actor.options(num_cpus=0).remote(spec, functools.partial(RankProbe, kind, grid))
        try:
            reports = ray.get(group.call_all.remote("report"), timeout=READY_TIMEOUT_S)
        finally:
            ray.get(group.shutdown.remote())
            ray.kill(group)
    finally:
        reserved.release()
    node_index = {n.node_id: i for i, n in enumerate(placement.cluster.nodes)}
    ranks, problems = [], []
    for slot, got in zip(placement.trainer_ranks, reports, strict=True):
        entry = {"rank": got["rank"], "engine": got["engine"], "tp_rank": got["tp_rank"], "node": slot.node,
                 "landed_node": node_index.get(got["node_id"], -1), "planned_devices": list(slot.devices),
                 "visible_devices": [int(d) for d in got["visible_devices"]], "device_index": got["device_index"]}  # fmt: skip
        if (entry["landed_node"], sorted(entry["visible_devices"])) != (slot.node, sorted(slot.devices)):
            problems.append(f"rank {entry['rank']}: planned node {slot.node} devices {list(slot.devices)}, "
                            f"landed on {entry['landed_node']} seeing {entry['visible_devices']}")  # fmt: skip
        if got["world_size"] != grid.world_size:
            problems.append(
                f"rank {entry['rank']} joined a group of {got['world_size']}, not {grid.world_size}"
            )
        ranks.append(entry)
    return {"engines": grid.engines, "tp": grid.tp, "ranks": ranks, "ok": not problems, "problems": problems}
