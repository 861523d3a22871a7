"""The vllm-ascend reload adapter against what was read of vllm-ascend v0.23.0 (the signatures
recorded in `vllm_reload`), and against the installed engine's classes where one is installed.

vllm-ascend's own update API (start_weight_update / update_weights / finish_weight_update) is
recorded but not called: it only takes weights through a transfer engine set up at engine start
(see the `vllm_reload` docstring), so these tests pin that the adapter keeps away from it and
reloads through the runner method, checked against its recorded signature first."""

from __future__ import annotations

import importlib.metadata
import inspect
import re
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from mindspeed_rl.models.rollout.vllm_reload import (
    ASCEND_WEIGHT_UPDATE_API,
    RECORDED_RUNNER_RELOAD,
    VLLM_WEIGHT_UPDATE_API,
    CpuWorkerReload,
    RunnerMethodReload,
    WorkerMethodReload,
    detect_vllm_install,
    parameters_of,
    reload_through_model_runner,
    weight_reloader,
)

WEIGHTS = [("model.norm.weight", object()), ("lm_head.weight", object())]


@pytest.fixture
def entered_configs(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """A stand-in for vllm.config that records each config entered, so no vLLM import is needed."""
    entered: list[object] = []

    @contextmanager
    def set_current_vllm_config(config: object) -> Iterator[None]:
        entered.append(config)
        yield

    module = types.ModuleType("vllm.config")
    module.set_current_vllm_config = set_current_vllm_config  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.config", module)
    return entered


class AscendRunner:
    """NPUModelRunner as far as the adapter meets it: vLLM's reload_weights, as recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any, torch.device]] = []
        self.model = torch.nn.Linear(4, 4)  # dense: wake_up's MoE swap has nothing to undo

    def reload_weights(
        self, weights_iterator: Any = None, weights_path: Any = None, is_checkpoint_format: bool = True
    ) -> None:
        # The default device shows whether the worker's device context was entered.
        self.calls.append((weights_iterator, weights_path, torch.get_default_device()))


class AscendWorker:
    """NPUWorker v0.23.0 as this adapter meets it: no reload_weights, and the RL update API with
    its recorded parameters, each raising as the real one does without a transfer engine."""

    def __init__(self, runner: Any) -> None:
        self.model_runner = runner
        # What the MoE layout restore reads (wake_up's own condition and hidden size).
        self.vllm_config = types.SimpleNamespace(
            quant_config=None,
            model_config=types.SimpleNamespace(hf_text_config=types.SimpleNamespace(hidden_size=4)),
        )
        # Not a real accelerator, but distinct from the default device, so entering it shows.
        self.device = torch.device("meta")
        self.api_calls: list[str] = []

    def _refuse(self, method: str) -> None:
        self.api_calls.append(method)
        raise RuntimeError("Weight transfer not configured. Please set weight_transfer_config")

    def start_weight_update(self, is_checkpoint_format: bool = True) -> None:
        self._refuse("start_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._refuse("update_weights")

    def finish_weight_update(self) -> None:
        self._refuse("finish_weight_update")


def test_the_fakes_have_the_recorded_signatures() -> None:
    worker = AscendWorker(AscendRunner())
    for method, recorded in ASCEND_WEIGHT_UPDATE_API.items():
        assert parameters_of(getattr(worker, method)) == recorded, method
    assert parameters_of(worker.model_runner.reload_weights) == RECORDED_RUNNER_RELOAD


def test_recorded_update_apis_take_no_weights() -> None:
    # Why the adapter does not use them: if a later release records a form that accepts the
    # weights themselves, this fails and the adapter choice has to be looked at again.
    for api in (ASCEND_WEIGHT_UPDATE_API, VLLM_WEIGHT_UPDATE_API):
        assert api["update_weights"] == ("update_info",)
        assert all("weights" not in p and "path" not in p for params in api.values() for p in params)


def test_ascend_worker_reloads_through_the_runner_in_its_device_and_config(
    entered_configs: list[object],
) -> None:
    worker = AscendWorker(AscendRunner())
    reload_through_model_runner(worker, weights_iterator=WEIGHTS)
    reload_through_model_runner(worker, weights_path="/snapshots/v3")
    assert worker.model_runner.calls == [
        (WEIGHTS, None, torch.device("meta")),
        (None, "/snapshots/v3", torch.device("meta")),
    ]
    assert entered_configs == [worker.vllm_config, worker.vllm_config]
    assert worker.api_calls == []
    assert torch.get_default_device() == torch.device("cpu")


class RunnerWithoutFormat(AscendRunner):
    def reload_weights(self, weights_iterator: Any = None, weights_path: Any = None) -> None:  # type: ignore[override]
        super().reload_weights(weights_iterator, weights_path)


class RunnerInKernelFormat(AscendRunner):
    def reload_weights(
        self, weights_iterator: Any = None, weights_path: Any = None, is_checkpoint_format: bool = False
    ) -> None:
        super().reload_weights(weights_iterator, weights_path)


class ForwardingRunner(AscendRunner):
    def reload_weights(self, *args: Any, **kwargs: Any) -> None:
        super().reload_weights(*args, **kwargs)


@pytest.mark.parametrize(
    ("runner", "found"),
    [
        (RunnerWithoutFormat(), "(weights_iterator=None, weights_path=None)"),
        (RunnerInKernelFormat(), "(weights_iterator=None, weights_path=None, is_checkpoint_format=False)"),
        (ForwardingRunner(), "(*args, **kwargs)"),
    ],
)
def test_a_changed_runner_signature_is_a_clear_error(
    runner: AscendRunner, found: str, entered_configs: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker looks up the installed engine itself; here it is an Ascend install.
    versions = {"vllm-ascend": "0.23.0.post1", "vllm": "0.23.0+empty"}

    def version(name: str) -> str:
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    worker = AscendWorker(runner)
    expected = (
        rf"{type(runner).__qualname__}\.reload_weights{re.escape(found)} in vllm-ascend 0\.23\.0\.post1 "
        rf"differs from the recorded {re.escape('(' + ', '.join(RECORDED_RUNNER_RELOAD) + ')')}"
    )
    with pytest.raises(RuntimeError, match=expected):
        reload_through_model_runner(worker, weights_iterator=WEIGHTS)
    assert runner.calls == [] and entered_configs == [] and worker.api_calls == []


def installed(**versions: str) -> Any:
    return lambda name: versions.get(name.replace("-", "_"))


@pytest.mark.parametrize(
    ("versions", "adapter"),
    [
        ({"vllm_ascend": "0.23.0.post1", "vllm": "0.23.0+empty"}, RunnerMethodReload),
        ({"vllm_ascend": "0.25.1rc1", "vllm": "0.25.1"}, RunnerMethodReload),
        ({"vllm_cpu": "0.32.0+cpu"}, CpuWorkerReload),
        ({"vllm": "0.33.0"}, WorkerMethodReload),
    ],
)
def test_the_family_and_version_pick_the_adapter(versions: dict[str, str], adapter: type) -> None:
    assert type(weight_reloader(detect_vllm_install(installed(**versions)))) is adapter


def test_the_first_ascend_release_with_the_update_api_is_still_refused() -> None:
    # v0.22.1rc1 has the update API but its runner was never read for reload_weights.
    install = detect_vllm_install(installed(vllm_ascend="0.22.1rc1", vllm="0.22.1"))
    with pytest.raises(ValueError, match=r"vllm-ascend 0\.22\.1rc1 cannot reload.*vllm-ascend>=0\.23\.0"):
        weight_reloader(install)


def test_the_ascend_adapter_sends_the_runner_function_not_the_update_api() -> None:
    calls: list[Any] = []

    class LLM:
        def collective_rpc(self, method: Any, kwargs: dict[str, Any] | None = None) -> list[None]:
            calls.append(method)
            return [None]

    reloader = weight_reloader(detect_vllm_install(installed(vllm_ascend="0.23.0.post1")))
    reloader.from_tensors(LLM(), WEIGHTS)
    reloader.from_path(LLM(), "/snapshots/v3")
    assert calls == [reload_through_model_runner, reload_through_model_runner]


@pytest.mark.vllm
def test_installed_vllm_cpu_worker_matches_the_records() -> None:
    """On this machine's engine: what the vllm-cpu adapter and the runner path call, and the
    update API recorded for plain vLLM."""
    pytest.importorskip("vllm")
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed (make setup installs it)")
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.cpu_worker import CPUWorker

    # CpuWorkerReload calls worker.reload_weights(weights_iterator=..., weights_path=...).
    signature = inspect.signature(CPUWorker.reload_weights)
    signature.bind(None, weights_iterator=WEIGHTS, weights_path=None)
    signature.bind(None, weights_iterator=None, weights_path="/snapshots/v3")
    # The worker method forwards to the runner's, which must take those names (dropping `self`).
    assert parameters_of(CPUModelRunner.reload_weights)[1:] == RECORDED_RUNNER_RELOAD, version
    for method, recorded in VLLM_WEIGHT_UPDATE_API.items():
        assert parameters_of(getattr(CPUWorker, method))[1:] == recorded, (version, method)


@pytest.mark.vllm
def test_installed_vllm_ascend_worker_matches_the_records() -> None:
    """Only where vllm-ascend (and its NPU stack) is installed; not run on this machine."""
    worker_module = pytest.importorskip("vllm_ascend.worker.worker")
    runner_module = pytest.importorskip("vllm_ascend.worker.model_runner_v1")
    version = importlib.metadata.version("vllm-ascend")
    npu_worker = worker_module.NPUWorker
    assert not hasattr(npu_worker, "reload_weights"), version
    assert parameters_of(runner_module.NPUModelRunner.reload_weights)[1:] == RECORDED_RUNNER_RELOAD
    for method, recorded in ASCEND_WEIGHT_UPDATE_API.items():
        assert parameters_of(getattr(npu_worker, method))[1:] == recorded, (version, method)
