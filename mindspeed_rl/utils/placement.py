"""Per-node placement of a run's actors: which node and which device indices each one gets.

::

    PlacementRequest (from the run plan)        ClusterSpec (``--cluster 8x8``, or ray.nodes())
      trainer ranks     k x (d devices, c CPUs)     node 0: D devices, C CPUs
      generation actors m x (TP x PP devices)       node 1: ...
      control actors    CPU only                    ...
                         └──────── plan_placement ────────┘
                                         ▼
      Placement: per trainer rank / generation actor / control actor: node index, device indices

Order, and why: trainer ranks first, packed node by node (consecutive ranks share a node, so
Megatron's tensor-parallel groups stay inside one node); then each generation actor whole on the
first node with room (its TP x PP devices form one placement bundle, and a bundle cannot span
nodes); then the CPU-only control actors wherever CPUs are left. In the colocated hybrid (upstream's
``pipeline: hybrid`` on accelerators) rollout engines take no devices of their own: each one runs on
the devices of TP x PP consecutive trainer ranks, which must then sit on one node.

Device indices are the order in which Ray hands out a node's devices to the bundles of one
placement group created in this order (``ray_setup.reserve``); the integration test checks that
actors see exactly these ids. Pure: no Ray, no torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

DeviceKind = Literal["GPU", "NPU"]
EPS = 1e-9
_CLUSTER = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*(?:x\s*(\d+(?:\.\d+)?))?\s*$")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """One node as the planner sees it."""

    node_id: str
    """Ray node id on a live cluster; ``node<i>`` for a described one."""
    num_devices: int
    """Devices of the run's kind (GPU or NPU) on this node."""
    num_cpus: float | None
    """None: CPUs are not checked (a described cluster that did not state them)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]

    @classmethod
    def parse(cls, text: str) -> ClusterSpec:
        """``NxD`` (N nodes of D devices) or ``NxDxC`` (and C CPUs each)."""
        match = _CLUSTER.match(text)
        if match is None or int(match.group(1)) < 1:
            raise ValueError(
                f"cannot parse cluster {text!r}; write NODESxDEVICES (8x8) or NODESxDEVICESxCPUS (8x8x192)"
            )
        cpus = float(match.group(3)) if match.group(3) else None
        return cls.uniform(int(match.group(1)), int(match.group(2)), cpus)

    @classmethod
    def uniform(cls, num_nodes: int, num_devices: int, num_cpus: float | None) -> ClusterSpec:
        return cls(
            nodes=tuple(
                NodeSpec(node_id=f"node{i}", num_devices=num_devices, num_cpus=num_cpus)
                for i in range(num_nodes)
            )
        )

    @classmethod
    def one_node(cls, resources: Mapping[str, float], kind: DeviceKind | None) -> ClusterSpec:
        """A single node holding ``resources`` (Ray's names: CPU, GPU, NPU)."""
        devices = int(resources.get(kind, 0.0) + EPS) if kind else 0
        return cls(
            nodes=(NodeSpec(node_id="node0", num_devices=devices, num_cpus=resources.get("CPU", 0.0)),)
        )

    def describe(self, kind: DeviceKind | None) -> str:
        """``4 nodes x 8 = 32 NPUs`` (or the per-node list when nodes differ)."""
        nodes = "1 node" if len(self.nodes) == 1 else f"{len(self.nodes)} nodes"
        return f"{nodes} x {_sizes(self)} = {self.total_devices} {kind or 'device'}s"

    @property
    def total_devices(self) -> int:
        return sum(n.num_devices for n in self.nodes)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleRequest:
    """``count`` actors of one role, each asking for ``num_devices`` on one node and ``num_cpus``."""

    name: str
    count: int
    num_devices: int
    num_cpus: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementRequest:
    """What the run plan asks the cluster for (``run_plan_placement.placement_request``)."""

    device_kind: DeviceKind | None
    """None: a CPU-only run (devices of the cluster are not used)."""
    device_kind_reason: str
    """Which config keys chose the kind (printed by ``check_config --cluster``)."""
    trainer: RoleRequest
    """The trainer ranks (torch engine: one rank; Megatron layout: TP x PP x CP x DP ranks)."""
    generation: RoleRequest
    """Every generation actor, GU-major (actor ``a`` of GU ``g`` is index ``g * actors_per_unit + a``)."""
    actors_per_unit: int | None
    """Generation actors per GU (async); None in the hybrid pipeline (no GUs)."""
    colocated: bool
    """Rollout engines run on the trainer ranks' devices (hybrid on accelerators)."""
    control: tuple[RoleRequest, ...] = ()
    """CPU-only actors (Control Unit, GU control processes)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Slot:
    """Where one actor goes."""

    name: str
    index: int
    """Trainer rank, global generation-actor index, or the index within a control role."""
    node: int
    """Index into ``ClusterSpec.nodes``."""
    devices: tuple[int, ...]
    """Device indices on that node (empty for CPU-only actors)."""
    num_cpus: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    request: PlacementRequest
    cluster: ClusterSpec
    trainer_ranks: tuple[Slot, ...]
    generation_actors: tuple[Slot, ...]
    control_actors: tuple[Slot, ...]

    @property
    def uses_devices(self) -> bool:
        """True when the run asks for GPUs/NPUs: then actors go into a placement group."""
        return self.request.device_kind is not None

    def to_dict(self) -> dict[str, Any]:
        r = self.request
        per_unit = r.actors_per_unit
        generation = [
            _slot_dict(s, engine=s.index)
            if per_unit is None
            else _slot_dict(s, gu=s.index // per_unit, actor=s.index % per_unit)
            for s in self.generation_actors
        ]
        return {
            "device_kind": r.device_kind,
            "device_kind_from": r.device_kind_reason,
            "colocated": r.colocated,
            "nodes": [
                {"node": i, "node_id": n.node_id, "devices": n.num_devices, "cpus": n.num_cpus}
                for i, n in enumerate(self.cluster.nodes)
            ],
            "devices_used": _devices_used(self),
            "trainer_ranks": [_slot_dict(s, rank=s.index) for s in self.trainer_ranks],
            "generation_actors": generation,
            "control_actors": [_slot_dict(s, name=s.name, index=s.index) for s in self.control_actors],
        }


def plan_placement(request: PlacementRequest, cluster: ClusterSpec) -> Placement:
    """Place every actor of ``request`` on ``cluster``, or raise a ValueError naming what is short."""
    _check_sizes(request, cluster)
    _check_totals(request, cluster)
    free = _Free.of(cluster)
    trainer = _pack_trainer(request.trainer, free, request.device_kind)
    if request.colocated:
        generation = _colocate(request.generation, trainer, free, request.device_kind)
    else:
        generation = tuple(
            _first_fit(request.generation, i, free, request.device_kind, after=_after(request.trainer))
            for i in range(request.generation.count)
        )
    # Control actors are numbered within their role (control unit 0, generation unit 0..G-1).
    control = [
        _first_fit(role, i, free, None, after="the trainer ranks and generation actors")
        for role in request.control
        for i in range(role.count)
    ]
    return Placement(
        request=request,
        cluster=cluster,
        trainer_ranks=trainer,
        generation_actors=generation,
        control_actors=tuple(control),
    )


@dataclass(slots=True)
class _Free:
    """What is left on each node while placing: device indices are handed out in order."""

    next_device: list[int]
    devices: list[int]
    cpus: list[float | None]

    @classmethod
    def of(cls, cluster: ClusterSpec) -> _Free:
        return cls(
            next_device=[0] * len(cluster.nodes),
            devices=[n.num_devices for n in cluster.nodes],
            cpus=[n.num_cpus for n in cluster.nodes],
        )

    def fits(self, node: int, num_devices: int, num_cpus: float) -> bool:
        cpus = self.cpus[node]
        return self.devices[node] >= num_devices and (cpus is None or cpus + EPS >= num_cpus)

    def take(self, node: int, num_devices: int, num_cpus: float) -> tuple[int, ...]:
        start = self.next_device[node]
        self.next_device[node] += num_devices
        self.devices[node] -= num_devices
        cpus = self.cpus[node]
        if cpus is not None:
            self.cpus[node] = cpus - num_cpus
        return tuple(range(start, start + num_devices))

    def summary(self, kind: DeviceKind | None) -> str:
        cpus = (
            ""
            if all(c is None for c in self.cpus)
            else f", free CPUs per node {[_num(c) for c in self.cpus]}"
        )
        return f"free {kind or 'device'}s per node {self.devices}{cpus}"


def _pack_trainer(role: RoleRequest, free: _Free, kind: DeviceKind | None) -> tuple[Slot, ...]:
    slots: list[Slot] = []
    node = 0
    for rank in range(role.count):
        while node < len(free.devices) and not free.fits(node, role.num_devices, role.num_cpus):
            node += 1
        if node == len(free.devices):
            raise ValueError(
                f"{role.name} {rank} of {role.count} ({_ask(role, kind)}) fits no node after ranks "
                f"0..{rank - 1}: {free.summary(kind)}; use fewer trainer ranks or larger nodes"
            )
        slots.append(Slot(name=role.name, index=rank, node=node,
                          devices=free.take(node, role.num_devices, role.num_cpus), num_cpus=role.num_cpus))  # fmt: skip
    return tuple(slots)


def _first_fit(role: RoleRequest, index: int, free: _Free, kind: DeviceKind | None, *, after: str) -> Slot:
    for node in range(len(free.devices)):
        if free.fits(node, role.num_devices, role.num_cpus):
            devices = free.take(node, role.num_devices, role.num_cpus)
            return Slot(name=role.name, index=index, node=node, devices=devices, num_cpus=role.num_cpus)
    raise ValueError(
        f"{role.name} {index} ({_ask(role, kind)}) fits no node after placing {after}: "
        f"{free.summary(kind)}; the devices left are split across nodes. Use fewer or smaller "
        "actors, or nodes whose device count is a multiple of the actor size"
    )


def _colocate(
    role: RoleRequest, trainer: tuple[Slot, ...], free: _Free, kind: DeviceKind | None
) -> tuple[Slot, ...]:
    """Rollout engines on consecutive trainer devices (upstream's hybrid): engine e gets devices
    [e * size, (e + 1) * size) of the trainer's, which must lie on one node."""
    flat = [(s.node, d) for s in trainer for d in s.devices]
    size = role.num_devices
    if size < 1 or role.count * size != len(flat):
        raise ValueError(
            f"{role.count} colocated {role.name}s x {size} {kind} do not cover the trainer's {len(flat)} "
            f"{kind}s; the trainer's device count must be a multiple of the rollout TP x PP"
        )
    slots = []
    for e in range(role.count):
        chunk = flat[e * size : (e + 1) * size]
        nodes = {n for n, _ in chunk}
        if len(nodes) != 1:
            raise ValueError(
                f"colocated {role.name} {e} ({size} {kind}s) would span nodes {sorted(nodes)}; make the "
                f"{kind}s per node a multiple of the rollout TP x PP ({size})"
            )
        node = chunk[0][0]
        if not free.fits(node, 0, role.num_cpus):
            raise ValueError(
                f"colocated {role.name} {e} needs {_num(role.num_cpus)} CPUs on node {node}: {free.summary(kind)}"
            )
        free.take(node, 0, role.num_cpus)
        slots.append(Slot(name=role.name, index=e, node=node, devices=tuple(d for _, d in chunk),
                          num_cpus=role.num_cpus))  # fmt: skip
    return tuple(slots)


def _check_sizes(request: PlacementRequest, cluster: ClusterSpec) -> None:
    """One actor bigger than every node: say so before any packing arithmetic."""
    kind = request.device_kind
    if kind is not None and cluster.total_devices == 0:
        raise ValueError(
            f"the config asks for {kind}s ({request.device_kind_reason}) but the cluster's nodes have none; "
            f"run on {kind} nodes, or remove the device requests for a CPU-only run"
        )
    biggest = max(n.num_devices for n in cluster.nodes)
    cpus = [n.num_cpus for n in cluster.nodes if n.num_cpus is not None]
    for role in _roles(request):
        if role.count and role.num_devices > biggest:
            raise ValueError(
                f"a {role.name} of {role.num_devices} {kind}s fits no node of {biggest}: one actor's devices "
                f"must sit on one node. {_size_fix(role)}"
            )
        if role.count and cpus and role.num_cpus > max(cpus) + EPS:
            raise ValueError(
                f"a {role.name} asking {_num(role.num_cpus)} CPUs fits no node (the largest has "
                f"{_num(max(cpus))}); lower its num_cpus (fractions are fine)"
            )


def _check_totals(request: PlacementRequest, cluster: ClusterSpec) -> None:
    kind = request.device_kind
    roles = [r for r in _roles(request) if r.count]
    device_roles = [r for r in roles if r.num_devices and not (request.colocated and r is request.generation)]
    needed = sum(r.count * r.num_devices for r in device_roles)
    have = cluster.total_devices
    if needed > have:
        detail = " + ".join(f"{_many(r)} x {r.num_devices} {kind}" for r in device_roles)
        raise ValueError(
            f"{detail} need {needed} {kind}s on nodes of {_sizes(cluster)}; the cluster has "
            f"{cluster.describe(kind)}: short by {needed - have} {kind}s. Add nodes or lower the device "
            "requests in the config"
        )
    if any(n.num_cpus is None for n in cluster.nodes):
        return
    cpus_needed = sum(r.count * r.num_cpus for r in roles)
    cpus_have = sum(n.num_cpus or 0.0 for n in cluster.nodes)
    if cpus_needed > cpus_have + EPS:
        detail = " + ".join(f"{_many(r)} x {_num(r.num_cpus)}" for r in roles)
        raise ValueError(
            f"actors need {_num(cpus_needed)} CPU ({detail}) but the cluster has {_num(cpus_have)} "
            f"({len(cluster.nodes)} node(s)); lower the num_cpus requests in the config (fractions are "
            "fine) or add nodes"
        )


def _roles(request: PlacementRequest) -> Sequence[RoleRequest]:
    return (request.trainer, request.generation, *request.control)


def _size_fix(role: RoleRequest) -> str:
    if role.name.startswith("trainer"):
        return "Upstream's group-wide num_npus is split one rank per device by a Megatron layout (use_mcore_models: true)"
    return "Lower the actor's TP x PP (and its device request) to fit one node"


def _after(role: RoleRequest) -> str:
    return f"the {_many(role)}"


def _many(role: RoleRequest) -> str:
    return f"{role.count} {role.name}{'' if role.count == 1 else 's'}"


def _sizes(cluster: ClusterSpec) -> str:
    sizes = [n.num_devices for n in cluster.nodes]
    return str(sizes[0]) if len(set(sizes)) == 1 else str(sizes)


def _ask(role: RoleRequest, kind: DeviceKind | None) -> str:
    devices = f"{role.num_devices} {kind}, " if role.num_devices else ""
    return f"{devices}{_num(role.num_cpus)} CPU"


def _num(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _devices_used(placement: Placement) -> int:
    used = sum(len(s.devices) for s in placement.trainer_ranks)
    if not placement.request.colocated:
        used += sum(len(s.devices) for s in placement.generation_actors)
    return used


def _slot_dict(slot: Slot, **ids: Any) -> dict[str, Any]:
    return {**ids, "node": slot.node, "devices": list(slot.devices), "cpus": slot.num_cpus}
