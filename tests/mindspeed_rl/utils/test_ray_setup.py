"""ray_setup: cluster detection that never hangs, runtime_env checks, config-driven requests."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from mindspeed_rl.config_cls import ActorResources
from mindspeed_rl.utils import ray_setup
from mindspeed_rl.utils.placement import ClusterSpec, PlacementRequest, RoleRequest, plan_placement


@pytest.fixture
def listening() -> Iterator[str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


def _dead_address() -> str:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    return f"127.0.0.1:{port}"


def _bootstrap(tmp_path: Path, address: str) -> dict[str, str]:
    env = {"RAY_TMPDIR": str(tmp_path)}
    ray_setup.bootstrap_file(env).parent.mkdir(parents=True)
    ray_setup.bootstrap_file(env).write_text(address + "\n")
    return env


def test_explicit_ray_address_is_used_when_it_answers(listening: str) -> None:
    assert ray_setup.find_cluster_address({"RAY_ADDRESS": listening}) == listening
    assert ray_setup.find_cluster_address({"RAY_ADDRESS": "ray://head:10001"}) == "ray://head:10001"
    assert ray_setup.find_cluster_address({"RAY_ADDRESS": "local"}) is None


def test_explicit_ray_address_that_does_not_answer_is_an_error_not_a_hang() -> None:
    dead = _dead_address()
    with pytest.raises(ValueError, match=f"RAY_ADDRESS={dead} does not answer; start the cluster"):
        ray_setup.find_cluster_address({"RAY_ADDRESS": dead}, timeout_s=0.5)


def test_running_cluster_on_this_node_is_joined(tmp_path: Path, listening: str) -> None:
    assert ray_setup.find_cluster_address(_bootstrap(tmp_path, listening)) == listening


def test_stale_bootstrap_file_or_none_starts_a_local_cluster(tmp_path: Path) -> None:
    assert ray_setup.find_cluster_address({"RAY_TMPDIR": str(tmp_path)}) is None
    assert ray_setup.find_cluster_address(_bootstrap(tmp_path, _dead_address()), timeout_s=0.5) is None


def test_runtime_env_yaml_is_loaded_and_values_must_be_strings(tmp_path: Path) -> None:
    repo_env = ray_setup.load_runtime_env(ray_setup.REPO_RUNTIME_ENV)["env_vars"]
    # Left to the engine (in-process at TP1, worker processes at TP > 1): a worker-wide "0" would
    # forbid tensor-parallel actors.
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in repo_env
    assert repo_env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    bad = tmp_path / "env.yaml"
    bad.write_text("env_vars:\n  TOKENIZERS_PARALLELISM: false\n")
    with pytest.raises(
        ValueError, match=r"env_vars.TOKENIZERS_PARALLELISM = False must be a string; quote it"
    ):
        ray_setup.load_runtime_env(bad)
    with pytest.raises(ValueError, match="set rl_config.runtime_env_path"):
        ray_setup.load_runtime_env(tmp_path / "missing.yaml")


def test_actor_options_come_from_config() -> None:
    assert ray_setup.ray_actor_options(ActorResources(num_cpus=0.25)) == {"num_cpus": 0.25, "num_gpus": 0.0}
    npu = ray_setup.ray_actor_options(ActorResources(num_cpus=4, num_npus=2))
    assert npu == {"num_cpus": 4, "num_gpus": 0.0, "resources": {"NPU": 2}}


def _node(node_id: str, alive: bool = True, **resources: float) -> dict[str, object]:
    return {"NodeID": node_id, "Alive": alive, "Resources": resources}


def test_live_cluster_view_keeps_alive_nodes_and_the_run_s_device_kind() -> None:
    nodes = [
        _node("a", CPU=64.0, NPU=8.0),
        _node("dead", alive=False, CPU=64.0, NPU=8.0),
        _node("b", CPU=32.0),
    ]
    cluster = ray_setup.cluster_from_nodes(nodes, "NPU")
    assert [(n.node_id, n.num_devices, n.num_cpus) for n in cluster.nodes] == [("a", 8, 64.0), ("b", 0, 32.0)]
    assert [n.num_devices for n in ray_setup.cluster_from_nodes(nodes, None).nodes] == [0, 0]
    with pytest.raises(ValueError, match="no alive node"):
        ray_setup.cluster_from_nodes([_node("dead", alive=False, CPU=1.0)], None)


def _request(**kw: object) -> PlacementRequest:
    base: dict[str, object] = dict(
        device_kind="NPU", device_kind_reason="test", actors_per_unit=2, colocated=False,
        trainer=RoleRequest(name="trainer rank", count=3, num_devices=1, num_cpus=2.0),
        generation=RoleRequest(name="generation actor", count=2, num_devices=2, num_cpus=1.0),
        control=(RoleRequest(name="control unit", count=1, num_devices=0, num_cpus=1.0),),
    )  # fmt: skip
    return PlacementRequest(**{**base, **kw})  # type: ignore[arg-type]


def test_bundles_follow_the_plan_order_and_pin_nodes() -> None:
    cluster = ClusterSpec.uniform(2, 4, 16.0)
    bundles = ray_setup.placement_bundles(plan_placement(_request(), cluster))
    assert bundles.resources == (
        {"NPU": 1.0, "CPU": 2.0}, {"NPU": 1.0, "CPU": 2.0}, {"NPU": 1.0, "CPU": 2.0},
        {"NPU": 2.0, "CPU": 1.0}, {"NPU": 2.0, "CPU": 1.0},
    )  # fmt: skip
    # 3 ranks on node 0 leave 1 NPU there: both 2-NPU actors go to node 1.
    assert bundles.nodes == (0, 0, 0, 1, 1)
    assert (bundles.trainer, bundles.generation) == ((0, 1, 2), (3, 4))


def test_colocated_engines_share_their_first_rank_s_bundle() -> None:
    request = _request(
        colocated=True,
        actors_per_unit=None,
        control=(),
        trainer=RoleRequest(name="trainer rank", count=4, num_devices=1, num_cpus=1.0),
        generation=RoleRequest(name="rollout engine", count=2, num_devices=2, num_cpus=0.5),
    )
    bundles = ray_setup.placement_bundles(plan_placement(request, ClusterSpec.uniform(1, 4, 8.0)))
    assert bundles.generation == (0, 2) and len(bundles.resources) == 4
    assert bundles.resources[0] == {"NPU": 1.0, "CPU": 1.5} and bundles.resources[1] == {
        "NPU": 1.0,
        "CPU": 1.0,
    }


def test_cpu_only_runs_reserve_nothing_and_keep_the_configured_options() -> None:
    request = _request(
        device_kind=None,
        trainer=RoleRequest(name="trainer rank", count=1, num_devices=0, num_cpus=0.5),
        generation=RoleRequest(name="generation actor", count=2, num_devices=0, num_cpus=0.2),
    )
    reserved = ray_setup.reserve(plan_placement(request, ClusterSpec.uniform(1, 0, 2.0)))
    assert reserved.group is None
    configured = ActorResources(num_cpus=0.2)
    assert reserved.generation_actor_options(1, configured) == ray_setup.ray_actor_options(configured)
    reserved.release()  # nothing to release: must not need Ray


def test_a_cpu_actor_beside_a_generation_actor_asks_its_bundle_for_nothing() -> None:
    """Where a GU receives weights on its first generation actor's device (NCCL / HCCL channel)."""
    placement = plan_placement(_request(), ClusterSpec.uniform(2, 4, 16.0))
    group = object()  # the placement group ray.util would return
    reserved = ray_setup.ReservedPlacement(
        placement=placement, group=group, trainer_bundles=(0, 1, 2), generation_bundles=(3, 4)
    )
    options = reserved.beside_generation_actor(1, ActorResources(num_cpus=1.0))
    strategy = options.pop("scheduling_strategy")
    assert options == {"num_cpus": 0.0, "num_gpus": 0.0}
    assert strategy.placement_group is group and strategy.placement_group_bundle_index == 4
    cpu_only = dataclasses.replace(reserved, group=None)
    assert cpu_only.beside_generation_actor(1, ActorResources(num_cpus=1.0)) == {
        "num_cpus": 1.0,
        "num_gpus": 0.0,
    }


@pytest.mark.integration
@pytest.mark.slow
def test_init_ray_starts_a_local_cluster_with_the_runtime_env(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    from mindspeed_rl.config_cls import load_config_from_files

    configs = Path(__file__).resolve().parents[3] / "configs"
    config = load_config_from_files(configs, "grpo_tiny_cpu")
    if ray.is_initialized():
        pytest.skip("another test left Ray running in this process")
    try:
        cluster = ray_setup.init_ray(config, env={"RAY_TMPDIR": str(tmp_path)})
        assert not cluster.attached and cluster.resources["CPU"] == ray_setup.local_cpu_count()

        @ray.remote
        def read_env() -> str | None:
            import os

            return os.environ.get("VLLM_CPU_OMP_THREADS_BIND")

        options = ray_setup.ray_actor_options(config.rl_config.actor_resource)
        assert ray.get(read_env.options(**options).remote(), timeout=120) == "nobind"
    finally:
        ray.shutdown()
