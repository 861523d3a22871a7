"""Ray start-up for the CLIs: join a running cluster, or start a local one sized to this machine.

Decision order (never hangs on a dead address):
  1. ``RAY_ADDRESS`` set            -> join it (host:port is probed first; unreachable = error).
  2. a cluster started by ``ray start`` on this node (its bootstrap file names a GCS address that
     answers a TCP connect)        -> join it.
  3. otherwise                     -> start a local cluster with ``num_cpus`` = usable cores.
     ``address="local"`` is explicit because plain ``ray.init()`` would follow a stale bootstrap
     file of a cluster that has died.

Joining (1, 2) carries the cluster's token (``join_cluster``; the rules are in ``utils.ray_auth``):
a cluster found by its bootstrap file is joined as ``address="auto"`` would be, token mode on when
a token is available; ``RAY_ADDRESS`` leaves it to ``RAY_AUTH_MODE`` (``examples/ray_launch.sh``
sets it), and a refusal names the token sent and the fix.

Every actor's request comes from config through ``ray_actor_options``; requests are fractional on
small hosts (DESIGN.md: on 2 cores, actors asking for whole CPUs queue forever).

Placement on the live cluster (``utils.placement`` decides, this module realises it)::

    live_cluster(kind)   ray.nodes() (alive) -> ClusterSpec, one NodeSpec per node
    reserve(placement)   CPU-only run: nothing (actors keep their fractional-CPU options)
                         GPU/NPU run:  ONE placement group, one bundle per trainer rank and per
                                       generation actor, each pinned to its planned node
                                       (bundle_label_selector on ray.io/node-id)
    reserved.trainer_rank_options(r) / .generation_actor_options(i)   -> ActorClass.options(**...)

One group, bundles in plan order: Ray hands a node's devices to bundles in the order they are
committed, so the device ids an actor gets (``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES``,
set by Ray because the actor asks for GPU/NPU) are the plan's indices on a node nothing else uses.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mindspeed_rl.config_cls import ActorResources, GRPOConfig
from mindspeed_rl.utils import quiet_logs, ray_auth
from mindspeed_rl.utils.placement import ClusterSpec, DeviceKind, NodeSpec, Placement, Slot

PLACEMENT_READY_TIMEOUT_S = 120.0
# Colocated hybrid: trainer rank and rollout engine each ask half of the rank's device, so Ray
# gives both the same device id (it cannot hand one device to two whole requests).
COLOCATED_SHARE = 0.5
NODE_ID_LABEL = "ray.io/node-id"
REPO_RUNTIME_ENV = Path(__file__).resolve().parents[2] / "configs" / "envs" / "runtime_env.yaml"
PROBE_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RayCluster:
    """What ``init_ray`` connected to."""

    address: str
    """GCS address of the cluster."""
    attached: bool
    """True when an existing cluster was joined, False when a local one was started."""
    resources: Mapping[str, float]
    """Total cluster resources (CPU, GPU, NPU, memory, ...)."""


def init_ray(config: GRPOConfig, *, env: Mapping[str, str] | None = None) -> RayCluster:
    import ray

    env = os.environ if env is None else env
    if ray.is_initialized():
        # The caller (a test, a notebook) already chose the cluster; never start a second one.
        return _describe(ray, attached=True)
    runtime_env = load_runtime_env(config.rl_config.runtime_env_path or REPO_RUNTIME_ENV)
    # Every worker filters engine noise itself (Ray forwards actor output): utils/quiet_logs.py.
    runtime_env = quiet_logs.worker_runtime_env(runtime_env, env)
    address = find_cluster_address(env)
    if address is not None:
        join_cluster(address, found_locally=not env.get("RAY_ADDRESS"), runtime_env=runtime_env)
        return _describe(ray, attached=True)
    ray.init(address="local", num_cpus=local_cpu_count(), runtime_env=runtime_env, include_dashboard=False)
    return _describe(ray, attached=False)


def join_cluster(address: str, *, found_locally: bool, runtime_env: Mapping[str, Any] | None = None) -> None:
    """``ray.init(address=address)`` with the cluster's token (``utils.ray_auth``).

    A cluster found on this node (its bootstrap file) is joined as ``address="auto"`` would: token
    mode on when a token is available, Ray's own rule (its private helper, pinned ray 2.60), which
    Ray skips for any explicit address.
    An explicit ``RAY_ADDRESS`` keeps Ray's rule: the caller sets ``RAY_AUTH_MODE`` (the launcher
    does). A refusal is re-raised naming the token this process sent and how to give it the right one.
    """
    import ray
    from ray.exceptions import AuthenticationError

    if found_locally:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )

        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    try:
        if runtime_env is None:
            ray.init(address=address)
        else:
            ray.init(address=address, runtime_env=dict(runtime_env))
    except (ConnectionError, AuthenticationError) as err:
        raise ConnectionError(f"{ray_auth.refused_advice(address, os.environ)} ({err})") from err


def wait_for_nodes(address: str, nodes: int, timeout_s: float, poll_s: float = 2.0) -> int:
    """Join ``address`` once and wait until ``nodes`` nodes are alive; the count, or TimeoutError."""
    import ray

    join_cluster(address, found_locally=False)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            alive = sum(1 for n in ray.nodes() if n.get("Alive"))
            if alive >= nodes:
                return alive
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{alive} of {nodes} Ray nodes joined {address} in {timeout_s:g} s; start the others with "
                    f"RAY_HEAD={address} bash examples/ray_launch.sh --worker (with the head's token file)"
                )
            print(f"waiting for Ray nodes: {alive}/{nodes}", file=sys.stderr, flush=True)
            time.sleep(poll_s)
    finally:
        ray.shutdown()


def find_cluster_address(env: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The cluster to join, or None to start a local one (see the module doc for the order)."""
    explicit = env.get("RAY_ADDRESS", "")
    if explicit:
        if explicit != "local" and _is_host_port(explicit) and not _reachable(explicit, timeout_s):
            raise ValueError(
                f"RAY_ADDRESS={explicit} does not answer; start the cluster there "
                "(ray start --head) or unset RAY_ADDRESS to run on a local cluster"
            )
        return None if explicit == "local" else explicit
    bootstrap = bootstrap_file(env)
    if not bootstrap.is_file():
        return None
    address = bootstrap.read_text().strip()
    if address and _reachable(address, timeout_s):
        return address
    return None


def bootstrap_file(env: Mapping[str, str]) -> Path:
    """Where ``ray start`` records the address of the latest cluster on this node (Ray's own rule)."""
    if "RAY_TMPDIR" in env:
        root = env["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and "TMPDIR" in env:
        root = env["TMPDIR"]
    else:
        root = "/tmp"
    return Path(root) / "ray" / "ray_current_cluster"


def load_runtime_env(path: str | Path) -> dict[str, Any]:
    """Ray ``runtime_env`` from YAML; ``env_vars`` values must be strings (Ray's rule, checked here)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"runtime_env file {path} not found; set rl_config.runtime_env_path to an existing YAML"
        )
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping such as `env_vars: {{NAME: value}}`")
    env_vars = data.get("env_vars") or {}
    if not isinstance(env_vars, dict):
        raise ValueError(f'{path}: env_vars must be a mapping of NAME: "value"')
    for name, value in env_vars.items():
        if not isinstance(value, str):
            raise ValueError(f'{path}: env_vars.{name} = {value!r} must be a string; quote it ("{value}")')
    return {**data, "env_vars": dict(env_vars)}


def ray_actor_options(resources: ActorResources) -> dict[str, Any]:
    """``ActorClass.options(**ray_actor_options(r))`` for one actor's configured request."""
    options: dict[str, Any] = {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus}
    if resources.num_npus > 0:
        options["resources"] = {"NPU": resources.num_npus}
    return options


def cluster_from_nodes(nodes: Sequence[Mapping[str, Any]], kind: DeviceKind | None) -> ClusterSpec:
    """``ray.nodes()`` entries -> the planner's view: alive nodes, their total devices and CPUs."""
    alive = [n for n in nodes if n.get("Alive", n.get("alive", False))]
    if not alive:
        raise ValueError("the Ray cluster has no alive node; start one (ray start --head)")
    return ClusterSpec(
        nodes=tuple(
            NodeSpec(
                node_id=str(n["NodeID"]),
                num_devices=int(float(n["Resources"].get(kind, 0.0)) + 1e-9) if kind else 0,
                num_cpus=float(n["Resources"].get("CPU", 0.0)),
            )
            for n in alive
        )
    )


def live_cluster(kind: DeviceKind | None) -> ClusterSpec:
    """The connected Ray cluster's alive nodes (totals per node: ``ray.nodes()``)."""
    import ray

    return cluster_from_nodes(ray.nodes(), kind)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReservedPlacement:
    """A placement realised on the live cluster: the actor options that put each actor there."""

    placement: Placement
    group: Any
    """The Ray placement group; None on a CPU-only run (Ray places fractional-CPU actors freely)."""
    trainer_bundles: tuple[int | None, ...]
    generation_bundles: tuple[int | None, ...]

    def trainer_rank_options(self, rank: int, configured: ActorResources) -> dict[str, Any]:
        """Options of trainer rank ``rank``; ``configured`` is its config request (CPU-only runs)."""
        if self.group is None:
            return ray_actor_options(configured)
        slot = self.placement.trainer_ranks[rank]
        share = COLOCATED_SHARE if self.placement.request.colocated else None
        return self._options(slot, self.trainer_bundles[rank], configured, share)

    def generation_actor_options(self, index: int, configured: ActorResources) -> dict[str, Any]:
        """Options of generation actor ``index`` (GU-major; the hybrid's rollout engine ``index``)."""
        if self.group is None:
            return ray_actor_options(configured)
        slot = self.placement.generation_actors[index]
        share = COLOCATED_SHARE if self.placement.request.colocated else None
        return self._options(slot, self.generation_bundles[index], configured, share)

    def beside_generation_actor(self, index: int, configured: ActorResources) -> dict[str, Any]:
        """Options that put a CPU-only actor on the node of generation actor ``index``: in its
        bundle, asking nothing of it (no devices, no CPUs: the bundle holds the actor's only).
        ``configured`` where that actor has no bundle (CPU-only runs, CPU actors)."""
        bundle = self.generation_bundles[index] if self.group is not None else None
        if bundle is None:
            return ray_actor_options(configured)
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=bundle
        )
        return {"num_cpus": 0.0, "num_gpus": 0.0, "scheduling_strategy": strategy}

    def colocated_shard_options(self, rank: int) -> dict[str, Any]:
        """Options of a colocated rollout engine's shard on trainer rank ``rank``'s device: the
        rank's bundle and device share, no CPUs of its own (the rank's process hosts it)."""
        slot = self.placement.trainer_ranks[rank]
        shard = Slot(name=slot.name, index=slot.index, node=slot.node, devices=slot.devices, num_cpus=0.0)
        return self._options(shard, self.trainer_bundles[rank], ActorResources(num_cpus=0.0), COLOCATED_SHARE)

    def release(self) -> None:
        if self.group is not None:
            from ray.util import remove_placement_group

            remove_placement_group(self.group)

    def _options(
        self, slot: Slot, bundle: int | None, configured: ActorResources, share: float | None
    ) -> dict[str, Any]:
        if bundle is None:  # an actor without devices on a device run: anywhere with CPUs
            return ray_actor_options(configured)
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        devices = share if share is not None else float(len(slot.devices))
        options: dict[str, Any] = {"num_cpus": slot.num_cpus, "num_gpus": 0.0}
        if self.placement.request.device_kind == "GPU":
            options["num_gpus"] = devices
        else:
            options["resources"] = {"NPU": devices}
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=bundle
        )
        return options


@dataclass(frozen=True, slots=True, kw_only=True)
class Bundles:
    """The placement group's bundles in plan order (trainer ranks, then generation actors)."""

    resources: tuple[Mapping[str, float], ...]
    nodes: tuple[int, ...]
    """Planned node of each bundle."""
    trainer: tuple[int | None, ...]
    """Bundle of each trainer rank (None: the rank has no devices and needs no bundle)."""
    generation: tuple[int | None, ...]
    """Bundle of each generation actor; a colocated engine shares its first rank's bundle."""


def placement_bundles(placement: Placement) -> Bundles:
    kind = placement.request.device_kind
    resources: list[dict[str, float]] = []
    nodes: list[int] = []

    def add(slot: Slot) -> int | None:
        if not slot.devices or kind is None:
            return None
        bundle: dict[str, float] = {kind: float(len(slot.devices))}
        if slot.num_cpus > 0:
            bundle["CPU"] = slot.num_cpus
        resources.append(bundle)
        nodes.append(slot.node)
        return len(resources) - 1

    trainer = [add(slot) for slot in placement.trainer_ranks]
    if not placement.request.colocated:
        generation = [add(slot) for slot in placement.generation_actors]
    else:
        generation = [
            _colocated_bundle(placement, slot, trainer, resources) for slot in placement.generation_actors
        ]
    return Bundles(
        resources=tuple(resources), nodes=tuple(nodes), trainer=tuple(trainer), generation=tuple(generation)
    )


def _colocated_bundle(
    placement: Placement, engine: Slot, trainer: list[int | None], resources: list[dict[str, float]]
) -> int:
    """The bundle of the trainer rank holding the engine's first device; the engine's CPUs join it."""
    first = (engine.node, engine.devices[0])
    rank = next(s for s in placement.trainer_ranks if (s.node, *s.devices[:1]) == first)
    index = trainer[rank.index]
    if index is None or len(rank.devices) != 1:
        raise ValueError(
            "a colocated rollout engine shares one device per trainer rank; the trainer ranks hold "
            f"{len(rank.devices)} devices each: use a Megatron layout (use_mcore_models: true), one rank per device"
        )
    resources[index]["CPU"] = resources[index].get("CPU", 0.0) + engine.num_cpus
    return index


def reserve(placement: Placement, timeout_s: float = PLACEMENT_READY_TIMEOUT_S) -> ReservedPlacement:
    """Reserve ``placement`` (from ``live_cluster``) on the connected cluster; CPU-only: nothing."""
    if not placement.uses_devices:
        empty: tuple[None, ...] = ()
        return ReservedPlacement(
            placement=placement, group=None, trainer_bundles=empty, generation_bundles=empty
        )
    import ray
    from ray.util import placement_group

    bundles = placement_bundles(placement)
    nodes = placement.cluster.nodes
    group = placement_group(
        [dict(b) for b in bundles.resources],
        strategy="PACK",
        bundle_label_selector=[{NODE_ID_LABEL: nodes[n].node_id} for n in bundles.nodes],
    )
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove = ray.util.remove_placement_group
        remove(group)
        raise RuntimeError(
            f"the placement group of {len(bundles.resources)} bundles was not ready after {timeout_s:g} s although the "
            "nodes' totals fit: other jobs or actors hold those devices; free them or add nodes"
        ) from None
    return ReservedPlacement(
        placement=placement,
        group=group,
        trainer_bundles=bundles.trainer,
        generation_bundles=bundles.generation,
    )


def local_cpu_count() -> int:
    # Cores this process may use (containers and taskset limit them below os.cpu_count()).
    if sys.platform.startswith("linux"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _describe(ray: Any, *, attached: bool) -> RayCluster:
    context = ray.get_runtime_context()
    return RayCluster(
        address=str(context.gcs_address), attached=attached, resources=dict(ray.cluster_resources())
    )


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and "://" not in address and port.isdigit()


def _reachable(address: str, timeout_s: float) -> bool:
    if not _is_host_port(address):
        return False
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """``wait-nodes ADDRESS N [--timeout S]``: the launcher's wait for its worker nodes (exit 2 on
    a refused join or a timeout, with the fix)."""
    parser = argparse.ArgumentParser(prog="python -m mindspeed_rl.utils.ray_setup")
    sub = parser.add_subparsers(dest="command", required=True)
    wait = sub.add_parser("wait-nodes", help="wait until N nodes of the cluster at ADDRESS are alive")
    wait.add_argument("address")
    wait.add_argument("nodes", type=int)
    wait.add_argument("--timeout", type=float, default=3000.0, help="seconds (default 3000)")
    args = parser.parse_args(argv)
    try:
        alive = wait_for_nodes(args.address, args.nodes, args.timeout)
    except (ConnectionError, TimeoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"Ray cluster at {args.address}: {alive} node(s) alive", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
