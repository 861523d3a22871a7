"""Placement dry run: reserve a run's placement groups and start one tiny placeholder per trainer
rank and rollout actor, each reporting where it landed and which device it would bind.

    check_config --placement-dry-run                 the running cluster (address=auto)
    check_config --placement-dry-run --fake-cluster 2x8   Ray's test cluster with fake devices

What it proves before any weights load: the planned node of every actor, that the visible
devices Ray gives each one (with the production runtime_env) are the planned ids, distinct
within a node, and the device index each would bind (``utils.devices``). With
``async_config.role_envs`` each placeholder starts in its role's environment, as the real actor
would, and reports the interpreter it runs and which of its role's modules that node's copy of
the environment lacks. Everything reserved is
released before it returns. A colocated rollout engine lives in its trainer ranks' processes (one
shard per rank), so its placeholder is one per device it spans, and its visible devices are
their union. A colocated megatron hybrid also starts its real rank group
(``workers.colocated_probe``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mindspeed_rl.config_cls import ActorResources
from mindspeed_rl.utils.placement import ClusterSpec, DeviceKind, Placement, Slot

if TYPE_CHECKING:
    from mindspeed_rl.utils.role_envs import Role, RoleEnvs

RoleModules = Mapping["Role", Sequence[str]] | None
READY_TIMEOUT_S = 300.0
_ROLE_OF: dict[str, Role] = {"trainer_rank": "trainer", "rollout_actor": "rollout"}


class Placeholder:
    """Reports where it runs; started with a role's real Ray options, does nothing else."""

    def report(self, kind: str, modules: Sequence[str] = ()) -> dict[str, Any]:
        import sys

        import ray

        from mindspeed_rl.utils.devices import current_binding
        from mindspeed_rl.utils.env_probe import module_version

        context = ray.get_runtime_context()
        binding = current_binding(kind)  # type: ignore[arg-type]
        return {
            "node_id": context.get_node_id(),
            "visible_devices": list(binding.visible if binding.visible is not None else binding.assigned),
            "device_index": binding.index,
            # As Ray started it (py_executable): a venv's bin/python resolves to its base
            # interpreter, so the path, not its target, says which environment this is.
            "environment": sys.executable,
            "prefix": sys.prefix,
            "missing": [m for m in modules if module_version(m) is None],
        }


def dry_run(
    placement: Placement,
    role_envs: RoleEnvs | None = None,
    modules: RoleModules = None,
    *,
    require_modules: bool = True,
) -> dict[str, Any]:
    """Reserve ``placement`` on the connected cluster, start the placeholders (each in its role's
    environment: ``role_envs``), report, release. ``modules``: per role, what its environment
    must provide on every node (``utils.role_envs.required_modules``); each placeholder reports
    which its node lacks, a problem unless ``require_modules`` is False (a fake cluster)."""
    import ray

    from mindspeed_rl.utils.ray_setup import reserve
    from mindspeed_rl.utils.role_envs import role_options, role_runtime_env

    kind = placement.request.device_kind
    if kind is None:
        raise ValueError("a CPU-only run has no device placement to dry-run; it asks for no GPUs or NPUs")
    reserved = reserve(placement, timeout_s=READY_TIMEOUT_S)
    actor: Any = ray.remote(Placeholder)
    started: list[tuple[dict[str, Any], Any]] = []
    trainer_env, rollout_env = role_runtime_env(role_envs, "trainer"), role_runtime_env(role_envs, "rollout")
    try:
        for slot in placement.trainer_ranks:
            options = role_options(trainer_env, reserved.trainer_rank_options(slot.index, _cpus(slot)))
            started.append((_entry("trainer_rank", slot), actor.options(**options).remote()))
        for slot, options in _rollout_options(placement, reserved):
            options = role_options(rollout_env, options)
            started.append((_entry("rollout_actor", slot), actor.options(**options).remote()))
        wanted = modules or {}
        refs = [h.report.remote(kind, wanted.get(_ROLE_OF[e["role"]], ())) for e, h in started]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=READY_TIMEOUT_S)
        if pending:
            names = [entry["name"] for (entry, _), ref in zip(started, refs, strict=True) if ref in pending]
            raise RuntimeError(
                f"{len(pending)} placeholders did not start within {READY_TIMEOUT_S:g} s (e.g. {names[:4]}): "
                "their Ray options do not fit their bundles, the cluster is short of CPUs, or their "
                "role's environment (async_config.role_envs) is missing on their node"
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
    verdict = _verdict(entries)
    verdict["problems"] += _environment_problems(entries, role_envs, require_modules)
    verdict["ok"] = not verdict["problems"]
    result = {"device_kind": kind, "placeholders": entries, **verdict}
    if role_envs is not None:
        result["role_envs"] = _per_role(entries, role_envs)
    return result


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
            "device_index": report["device_index"], "environment": report["environment"],
            "prefix": report["prefix"],
            "missing": list(report["missing"])}  # fmt: skip


def _environment_problems(
    entries: list[dict[str, Any]], role_envs: RoleEnvs | None, require_modules: bool
) -> list[str]:
    """A placeholder outside its role's interpreter, or whose node's copy of it lacks a module."""
    problems = []
    for e in entries:
        role = _ROLE_OF[e["role"]]
        expected = None if role_envs is None else role_envs.of(role).python
        if expected is not None and e["environment"] != expected:
            problems.append(f"{e['name']}: runs {e['environment']}, not the {role} environment {expected}")
        if e["missing"] and require_modules:
            where = expected or e["environment"]
            problems.append(
                f"{e['name']} on node {e['node']}: the {role} environment ({where}) lacks {', '.join(e['missing'])}"
            )
    return problems


def _per_role(entries: list[dict[str, Any]], role_envs: RoleEnvs) -> dict[str, Any]:
    """Per role: the configured environment, and which interpreter each of its actors started in."""
    out: dict[str, Any] = {}
    for entry_role, role in _ROLE_OF.items():
        mine = [e for e in entries if e["role"] == entry_role]
        out[role] = {
            "configured": role_envs.of(role).describe(),
            "actors": len(mine),
            "started_in": sorted({e["environment"] for e in mine}),
            "missing": sorted({m for e in mine for m in e["missing"]}),
        }
    return out


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
