"""Placement dry run: reserve a run's placement groups and start one tiny placeholder per trainer
rank and rollout actor, each reporting where it landed and which device it would bind.

    check_config --placement-dry-run                 the running cluster (address=auto)
    check_config --placement-dry-run --fake-cluster 2x8   Ray's test cluster with fake devices

What it proves before any weights load: the planned node of every actor, that the visible
devices Ray gives each one (with the production runtime_env) are the planned ids, distinct
within a node, and the device index each would bind (``utils.devices``). Everything reserved is
released before it returns. A colocated rollout engine lives in its trainer ranks' processes (one
shard per rank), so its placeholder is one per device it spans, and its visible devices are
their union. A colocated megatron hybrid also starts its real rank group
(``workers.colocated_probe``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from mindspeed_rl.config_cls import ActorResources
from mindspeed_rl.utils.placement import ClusterSpec, DeviceKind, Placement, Slot

READY_TIMEOUT_S = 300.0


class Placeholder:
    """Reports where it runs; started with a role's real Ray options, does nothing else."""

    def report(self, kind: str) -> dict[str, Any]:
        import ray

        from mindspeed_rl.utils.devices import current_binding

        context = ray.get_runtime_context()
        binding = current_binding(kind)  # type: ignore[arg-type]
        return {
            "node_id": context.get_node_id(),
            "visible_devices": list(binding.visible if binding.visible is not None else binding.assigned),
            "device_index": binding.index,
        }


def dry_run(placement: Placement) -> dict[str, Any]:
    """Reserve ``placement`` on the connected cluster, start the placeholders, report, release."""
    import ray

    from mindspeed_rl.utils.ray_setup import reserve

    kind = placement.request.device_kind
    if kind is None:
        raise ValueError("a CPU-only run has no device placement to dry-run; it asks for no GPUs or NPUs")
    reserved = reserve(placement, timeout_s=READY_TIMEOUT_S)
    actor: Any = ray.remote(Placeholder)
    started: list[tuple[dict[str, Any], Any]] = []
    try:
        for slot in placement.trainer_ranks:
            options = reserved.trainer_rank_options(slot.index, _cpus(slot))
            started.append((_entry("trainer_rank", slot), actor.options(**options).remote()))
        for slot, options in _rollout_options(placement, reserved):
            started.append((_entry("rollout_actor", slot), actor.options(**options).remote()))
        refs = [h.report.remote(kind) for _, h in started]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=READY_TIMEOUT_S)
        if pending:
            names = [entry["name"] for (entry, _), ref in zip(started, refs, strict=True) if ref in pending]
            raise RuntimeError(
                f"{len(pending)} placeholders did not start within {READY_TIMEOUT_S:g} s (e.g. {names[:4]}): "
                "their Ray options do not fit their bundles, or the cluster is short of CPUs"
            )
        reports = ray.get(refs)
    finally:
        for _, handle in started:
            ray.kill(handle)
        reserved.release()
    node_index = {n.node_id: i for i, n in enumerate(placement.cluster.nodes)}
    entries = _join_colocated(
        [_merged(entry, report, node_index) for (entry, _), report in zip(started, reports, strict=True)]
    )
    return {"device_kind": kind, "placeholders": entries, **_verdict(entries)}


@contextlib.contextmanager
def connected_cluster(kind: DeviceKind, runtime_env: Mapping[str, Any]) -> Iterator[ClusterSpec]:
    """The running cluster (``address="auto"``), joined with the run's ``runtime_env``."""
    import ray

    from mindspeed_rl.utils.ray_setup import live_cluster

    ray.init(address="auto", runtime_env=dict(runtime_env), log_to_driver=False)
    try:
        yield live_cluster(kind)
    finally:
        ray.shutdown()


def _cpus(slot: Slot) -> ActorResources:
    return ActorResources(num_cpus=slot.num_cpus)


def _entry(role: str, slot: Slot) -> dict[str, Any]:
    return {"role": role, "name": f"{slot.name} {slot.index}", "index": slot.index, "node": slot.node,
            "planned_devices": list(slot.devices)}  # fmt: skip


def _rollout_options(placement: Placement, reserved: Any) -> Iterator[tuple[Slot, dict[str, Any]]]:
    """Options per rollout placeholder: the actor's own bundle, or for a colocated engine one
    shard per device in the bundle of the rank holding that device."""
    if not placement.request.colocated:
        for slot in placement.generation_actors:
            yield slot, reserved.generation_actor_options(slot.index, _cpus(slot))
        return
    holder = {(s.node, d): s for s in placement.trainer_ranks for d in s.devices}
    for slot in placement.generation_actors:
        for device in slot.devices:
            rank = holder[(slot.node, device)]
            shard = Slot(name=slot.name, index=slot.index, node=slot.node, devices=(device,), num_cpus=0.0)
            yield shard, reserved.colocated_shard_options(rank.index)


def _merged(
    entry: dict[str, Any], report: Mapping[str, Any], node_index: Mapping[str, int]
) -> dict[str, Any]:
    return {**entry, "landed_node": node_index.get(report["node_id"], -1),
            "visible_devices": [int(d) for d in report["visible_devices"]],
            "device_index": report["device_index"]}  # fmt: skip


def _join_colocated(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per rollout engine: a colocated engine's shards merged (devices in order)."""
    out: list[dict[str, Any]] = []
    for e in entries:
        last = out[-1] if out else None
        if last is not None and last["role"] == e["role"] == "rollout_actor" and last["index"] == e["index"]:
            last["planned_devices"] = last["planned_devices"] + e["planned_devices"]
            last["visible_devices"] = last["visible_devices"] + e["visible_devices"]
        else:
            out.append(dict(e))
    return out


def _verdict(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a placeholder's node or visible devices differ from the plan, or two actors of one
    role share a device on a node (colocated engines share their ranks' devices by design)."""
    problems = []
    for e in entries:
        if e["landed_node"] != e["node"]:
            problems.append(f"{e['name']}: planned node {e['node']}, landed on {e['landed_node']}")
        if sorted(e["visible_devices"]) != sorted(e["planned_devices"]):
            problems.append(
                f"{e['name']}: planned devices {e['planned_devices']}, visible {e['visible_devices']}"
            )
    for role in ("trainer_rank", "rollout_actor"):
        seen: dict[tuple[int, int], str] = {}
        for e in (x for x in entries if x["role"] == role):
            for d in e["visible_devices"]:
                if (e["node"], d) in seen:
                    problems.append(
                        f"{e['name']} and {seen[(e['node'], d)]} both see device {d} of node {e['node']}"
                    )
                seen[(e["node"], d)] = e["name"]
    return {"ok": not problems, "problems": problems}


@contextlib.contextmanager
def fake_cluster(
    spec: ClusterSpec, kind: DeviceKind, runtime_env: Mapping[str, Any]
) -> Iterator[ClusterSpec]:
    """Ray's multi-node test cluster with ``spec``'s nodes, each holding fake ``kind`` devices
    (and its CPUs, default: 64 per node, only a number for the scheduler), connected with
    ``runtime_env``; yields the live cluster as the planner sees it."""
    import ray
    from ray.cluster_utils import Cluster

    from mindspeed_rl.utils.ray_setup import live_cluster

    if ray.is_initialized():
        raise RuntimeError("Ray is already initialised in this process; a fake cluster needs its own")

    def node_args(n: Any) -> dict[str, Any]:
        cpus = n.num_cpus if n.num_cpus is not None else 64
        if kind == "GPU":
            return {"num_cpus": cpus, "num_gpus": n.num_devices}
        return {"num_cpus": cpus, "resources": {"NPU": n.num_devices}}

    cluster = Cluster(initialize_head=True, head_node_args=node_args(spec.nodes[0]))
    try:
        for node in spec.nodes[1:]:
            cluster.add_node(**node_args(node))
        ray.init(address=cluster.address, runtime_env=dict(runtime_env), log_to_driver=False)
        cluster.wait_for_nodes()
        yield live_cluster(kind)
    finally:
        ray.shutdown()
        cluster.shutdown()
