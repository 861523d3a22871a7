"""ray_setup: cluster detection that never hangs, runtime_env checks, config-driven requests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from mindspeed_rl.config_cls import ActorResources
from mindspeed_rl.utils import ray_setup


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
    assert repo_env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
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


def test_requests_that_cannot_all_be_placed_fail_with_the_arithmetic() -> None:
    gen, trainer = ActorResources(num_cpus=0.5), ActorResources(num_cpus=1.0)
    ray_setup.check_requests_fit([("generation actor", gen, 2), ("trainer", trainer, 1)], {"CPU": 2.0})
    with pytest.raises(ValueError, match=r"actors need 3 CPU \(4 generation actor x 0.5 \+ 1 trainer x 1\)"):
        ray_setup.check_requests_fit([("generation actor", gen, 4), ("trainer", trainer, 1)], {"CPU": 2.0})
    with pytest.raises(ValueError, match="need 2 NPU"):
        ray_setup.check_requests_fit([("actor", ActorResources(num_npus=2), 1)], {"CPU": 8.0})


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
