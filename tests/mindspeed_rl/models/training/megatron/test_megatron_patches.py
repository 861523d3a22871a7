"""Each megatron-on-CPU shim, on its own (no megatron needed except for the import error test)."""

from __future__ import annotations

import importlib

import pytest
import torch

from mindspeed_rl.models.training.megatron import patches

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the shims are no-ops on CUDA hosts")


def test_current_device_answers_the_cpu_and_can_be_undone() -> None:
    original = torch.cuda.current_device
    try:
        patches.patch_current_device()
        assert torch.cuda.current_device() == torch.device("cpu")
        assert torch.zeros(1, device=torch.cuda.current_device()).device.type == "cpu"
    finally:
        patches.unpatch_current_device()
    assert torch.cuda.current_device is original


def test_causal_mask_blocks_exactly_the_future() -> None:
    mask = patches.causal_attention_mask(4, "cpu")
    assert mask.shape == (1, 1, 4, 4) and mask.dtype == torch.bool
    expected = torch.tensor([[j > i for j in range(4)] for i in range(4)])
    assert torch.equal(mask[0, 0], expected)


def test_device_mode_maps_cuda_factories_and_tensor_cuda_to_cpu() -> None:
    with patches.CudaDeviceToCpu():
        made = torch.empty(3, device="cuda")
        made_idx = torch.zeros(2, device=torch.device("cuda", 0))
        moved = torch.ones(2).cuda()
    assert made.device.type == made_idx.device.type == moved.device.type == "cpu"
    with pytest.raises((AssertionError, RuntimeError)):
        torch.empty(1, device="cuda")  # outside the mode nothing is rewritten


def test_runtime_mode_stubs_streams_and_sync_only_inside() -> None:
    original = (torch.cuda.synchronize, torch.cuda.current_stream)
    with patches.cpu_runtime_mode():
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        stream.wait_event(object())
        stream.wait_stream(stream)
        assert torch.zeros(1, device="cuda").device.type == "cpu"
    assert (torch.cuda.synchronize, torch.cuda.current_stream) == original


def test_runtime_mode_restores_on_error() -> None:
    original = torch.cuda.current_stream
    with pytest.raises(KeyError), patches.cpu_runtime_mode():
        raise KeyError("boom")
    assert torch.cuda.current_stream is original


def test_missing_megatron_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> object:
        if name.startswith("megatron"):
            raise ModuleNotFoundError(f"No module named {name!r}", name="megatron")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(ValueError, match="--ignore-requires-python megatron-core==0.19.2"):
        patches.import_megatron()


def test_other_missing_modules_are_not_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(name: str, package: str | None = None) -> object:
        raise ModuleNotFoundError("No module named 'triton'", name="triton")

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(ModuleNotFoundError, match="triton"):
        patches.import_megatron()


def test_rng_seed_uses_the_device_free_tracker_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    calls: list[tuple[int, dict[str, object]]] = []
    tensor_parallel = types.SimpleNamespace(
        model_parallel_cuda_manual_seed=lambda seed, **kw: calls.append((seed, kw))
    )
    core = types.ModuleType("megatron.core")
    core.tensor_parallel = tensor_parallel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron", types.ModuleType("megatron"))
    monkeypatch.setitem(sys.modules, "megatron.core", core)
    patches.seed_model_parallel_rng(7)
    assert calls == [(7, {"inference_rng_tracker": True, "force_reset_rng": True})]
