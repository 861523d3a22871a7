"""Ray start-up for the CLIs: join a running cluster, or start a local one sized to this machine.

Decision order (never hangs on a dead address):
  1. ``RAY_ADDRESS`` set            -> join it (host:port is probed first; unreachable = error).
  2. a cluster started by ``ray start`` on this node (its bootstrap file names a GCS address that
     answers a TCP connect)        -> join it.
  3. otherwise                     -> start a local cluster with ``num_cpus`` = usable cores.
     ``address="local"`` is explicit because plain ``ray.init()`` would follow a stale bootstrap
     file of a cluster that has died.

Every actor's request comes from config through ``ray_actor_options``; requests are fractional on
small hosts (DESIGN.md: on 2 cores, actors asking for whole CPUs queue forever).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mindspeed_rl.config_cls import ActorResources, GRPOConfig

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
    address = find_cluster_address(env)
    if address is not None:
        ray.init(address=address, runtime_env=runtime_env)
        return _describe(ray, attached=True)
    ray.init(address="local", num_cpus=local_cpu_count(), runtime_env=runtime_env, include_dashboard=False)
    return _describe(ray, attached=False)


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


def check_requests_fit(
    requests: Sequence[tuple[str, ActorResources, int]], available: Mapping[str, float]
) -> None:
    """Fail fast, with the arithmetic, when ``(name, request, count)`` actors cannot all be placed:
    Ray would otherwise queue the excess actors forever."""
    totals = {"CPU": 0.0, "GPU": 0.0, "NPU": 0.0}
    for _, r, count in requests:
        totals["CPU"] += r.num_cpus * count
        totals["GPU"] += r.num_gpus * count
        totals["NPU"] += r.num_npus * count
    for kind, needed in totals.items():
        have = float(available.get(kind, 0.0))
        if needed > have + 1e-9:
            detail = " + ".join(f"{count} {name} x {_amount(r, kind):g}" for name, r, count in requests)
            raise ValueError(
                f"actors need {needed:g} {kind} ({detail}) but the cluster has {have:g}; lower the "
                f"num_{kind.lower()}s requests in the config (fractions are fine) or add nodes"
            )


def local_cpu_count() -> int:
    # Cores this process may use (containers and taskset limit them below os.cpu_count()).
    if sys.platform.startswith("linux"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _amount(r: ActorResources, kind: str) -> float:
    return {"CPU": r.num_cpus, "GPU": r.num_gpus, "NPU": r.num_npus}[kind]


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
