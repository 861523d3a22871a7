"""The plan is where actors really land: Ray's 2-node test cluster with fake NPUs and GPUs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mindspeed_rl.config_cls import ActorResources
from mindspeed_rl.utils import ray_setup
from mindspeed_rl.utils.placement import DeviceKind, Placement, PlacementRequest, RoleRequest, plan_placement


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        pytest.skip("another test left Ray running in this process")
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 4, "resources": {"NPU": 4}}
    )
    cluster.add_node(num_cpus=2, num_gpus=4, resources={"NPU": 4})
    try:
        # The production runtime_env: what it sets (or leaves unset) decides the visible devices.
        ray.init(address=cluster.address, runtime_env=ray_setup.load_runtime_env(ray_setup.REPO_RUNTIME_ENV))
        cluster.wait_for_nodes()
        yield ray
    finally:
        ray.shutdown()
        cluster.shutdown()


def _probe_class() -> type:
    # Defined in a function so Ray pickles it by value (workers cannot import this test module).
    class Probe:
        def where(self, kind: str) -> tuple[str, list[str], str | None]:
            import os

            import ray

            from mindspeed_rl.utils.devices import current_binding

            context = ray.get_runtime_context()
            ids = [str(i) for i in context.get_accelerator_ids().get(kind, [])]
            # Every actor drives the first of its own devices, never another actor's.
            assert current_binding(kind).index == 0, current_binding(kind)  # type: ignore[arg-type]
            return (
                context.get_node_id(),
                ids,
                os.environ.get({"NPU": "ASCEND_RT_VISIBLE_DEVICES", "GPU": "CUDA_VISIBLE_DEVICES"}[kind]),
            )

    return Probe


def _request(
    kind: DeviceKind, trainer: RoleRequest, generation: RoleRequest, colocated: bool
) -> PlacementRequest:
    return PlacementRequest(
        device_kind=kind, device_kind_reason="test", trainer=trainer, generation=generation,
        actors_per_unit=None if colocated else 1, colocated=colocated,
    )  # fmt: skip


def _landed(ray: Any, placement: Placement) -> tuple[list[Any], list[Any], Any]:
    kind = placement.request.device_kind
    assert kind is not None
    reserved = ray_setup.reserve(placement, timeout_s=60)
    probe = ray.remote(_probe_class())
    unused = ActorResources(num_cpus=0.01)
    ranks = [
        probe.options(**reserved.trainer_rank_options(r, unused)).remote()
        for r in range(len(placement.trainer_ranks))
    ]
    actors = [
        probe.options(**reserved.generation_actor_options(i, unused)).remote()
        for i in range(len(placement.generation_actors))
    ]
    where = ray.get([h.where.remote(kind) for h in (*ranks, *actors)], timeout=120)
    for handle in (*ranks, *actors):
        ray.kill(handle)
    return where[: len(ranks)], where[len(ranks) :], reserved


def _expected(placement: Placement, slots: Any, devices: Any = None) -> list[Any]:
    nodes = placement.cluster.nodes
    return [
        (nodes[s.node].node_id, [str(d) for d in (devices(s) if devices else s.devices)],
         ",".join(str(d) for d in (devices(s) if devices else s.devices)))
        for s in slots
    ]  # fmt: skip


@pytest.mark.integration
def test_trainer_ranks_and_generation_actors_land_on_the_planned_npus(two_nodes: Any) -> None:
    ray = two_nodes
    request = _request(
        "NPU",
        RoleRequest(name="trainer rank", count=3, num_devices=1, num_cpus=0.1),
        RoleRequest(name="generation actor", count=2, num_devices=2, num_cpus=0.1),
        colocated=False,
    )
    placement = plan_placement(request, ray_setup.live_cluster("NPU"))
    # Ranks fill node 0 (devices 0-2); both 2-NPU actors need node 1.
    assert [s.node for s in placement.trainer_ranks] == [0, 0, 0]
    assert [(s.node, s.devices) for s in placement.generation_actors] == [(1, (0, 1)), (1, (2, 3))]
    ranks, actors, reserved = _landed(ray, placement)
    try:
        assert ranks == _expected(placement, placement.trainer_ranks)
        assert actors == _expected(placement, placement.generation_actors)
    finally:
        reserved.release()


@pytest.mark.integration
def test_colocated_engines_share_the_trainer_gpus(two_nodes: Any) -> None:
    ray = two_nodes
    request = _request(
        "GPU",
        RoleRequest(name="trainer rank", count=8, num_devices=1, num_cpus=0.1),
        RoleRequest(name="rollout engine", count=4, num_devices=2, num_cpus=0.1),
        colocated=True,
    )
    placement = plan_placement(request, ray_setup.live_cluster("GPU"))
    assert [s.node for s in placement.trainer_ranks] == [0] * 4 + [1] * 4
    ranks, engines, reserved = _landed(ray, placement)
    try:
        assert ranks == _expected(placement, placement.trainer_ranks)
        # Each engine shares the device of the first rank of its pair (Ray grants one device id).
        assert engines == _expected(placement, placement.generation_actors, devices=lambda s: s.devices[:1])
    finally:
        reserved.release()
