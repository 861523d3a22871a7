"""The colocated push into vllm-ascend after ``wake_up`` on an MoE model (issue 39, defect 6).

vllm-ascend v0.23.0's ``NPUWorker.wake_up`` swaps the experts' ``w13_weight`` / ``w2_weight`` for
transposed views (recorded in ``ascend_moe_layout.ASCEND_WAKE_UP_TRANSPOSES``). The push is vLLM's
layerwise reload, run here for real (the installed vLLM's ``reload/inplace.py`` and
``layerwise.py``) through ``reload_through_model_runner``, on a model whose expert layer stands in
for vllm-ascend's (its ``process_weights_after_loading`` needs torch_npu): the stand-in makes the
kernel layout exactly as ``AscendUnquantizedFusedMoEMethod.process_weights_after_loading`` does
(v0.23.0 ``vllm_ascend/ops/fused_moe/fused_moe.py:112-119``: ``transpose(1, 2).contiguous()``), and
the wake-up is applied from the recorded rules. The shapes have hidden != 2 x expert width, the
defect's case, plus one where they are equal.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
from vllm.model_executor.model_loader.reload.inplace import reload_weights

from mindspeed_rl.models.rollout.ascend_moe_layout import (
    ASCEND_WAKE_UP_TRANSPOSES,
    restore_kernel_layout,
    restore_worker_kernel_layout,
    rule_for,
)
from mindspeed_rl.models.rollout.vllm_reload import (
    RECORDED_RUNNER_RELOAD,
    parameters_of,
    reload_through_model_runner,
)

EXPERTS = 3


def _load_whole(param: torch.Tensor, loaded: torch.Tensor) -> None:
    param.data.copy_(loaded)


class KernelLayoutMethod(QuantizeMethodBase):
    """Stands in for vllm-ascend's ``AscendUnquantizedFusedMoEMethod`` (needs torch_npu): only its
    ``process_weights_after_loading`` matters to the reload, and this one makes the same layout."""

    def create_weights(self, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def apply(self, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        for name in ("w13_weight", "w2_weight"):
            kernel = getattr(layer, name).data.transpose(1, 2).contiguous()
            setattr(layer, name, torch.nn.Parameter(kernel, requires_grad=False))


class Experts(torch.nn.Module):
    """vLLM's FusedMoE parameters in the loader's layout: w13 (E, 2I, H), w2 (E, H, I)."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.quant_method = KernelLayoutMethod()
        for name, shape in (
            ("w13_weight", (EXPERTS, 2 * width, hidden)),
            ("w2_weight", (EXPERTS, hidden, width)),
        ):
            param = torch.nn.Parameter(torch.zeros(shape), requires_grad=False)
            param.weight_loader = _load_whole  # type: ignore[attr-defined]
            self.register_parameter(name, param)


class MoEModel(torch.nn.Module):
    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.layers[0].experts = Experts(hidden, width)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """As a vLLM model's: each weight through its parameter's (current) loader."""
        loaded = set()
        for name, tensor in weights:
            param = dict(self.named_parameters())[name]
            param.weight_loader(param, tensor)
            loaded.add(name)
        return loaded


class Runner:
    """GPUModelRunner.reload_weights as recorded (vLLM's in-place reload of ``model``)."""

    def __init__(self, model: MoEModel, vllm_config: Any) -> None:
        self.model, self._config = model, vllm_config

    def reload_weights(
        self, weights_iterator: Any = None, weights_path: Any = None, is_checkpoint_format: bool = True
    ) -> None:
        reload_weights(self._config, self.model, weights_iterator, weights_path, is_checkpoint_format)


def _weights(hidden: int, width: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "layers.0.experts.w13_weight": torch.randn(EXPERTS, 2 * width, hidden, generator=gen),
        "layers.0.experts.w2_weight": torch.randn(EXPERTS, hidden, width, generator=gen),
    }


def _worker(hidden: int, width: int, *, quantized: bool = False) -> Any:
    """A started engine's worker: the model loaded (metadata recorded first, as vLLM's loader
    does), processed into the kernel layout."""
    model = MoEModel(hidden, width)
    record_metadata_for_reloading(model)
    model.load_weights(_weights(hidden, width, seed=0).items())
    model.layers[0].experts.quant_method.process_weights_after_loading(model.layers[0].experts)
    model_config = types.SimpleNamespace(
        quantization=None, dtype=torch.float32, hf_text_config=types.SimpleNamespace(hidden_size=hidden)
    )
    config = types.SimpleNamespace(
        model_config=model_config,
        load_config=None,
        lora_config=None,
        quant_config=object() if quantized else None,
    )
    runner = Runner(model, config)
    assert parameters_of(runner.reload_weights) == RECORDED_RUNNER_RELOAD
    return types.SimpleNamespace(model_runner=runner, vllm_config=config, device=torch.device("cpu"))


def ascend_wake_up(model: torch.nn.Module, hidden: int) -> None:
    """vllm-ascend v0.23.0 ``NPUWorker.wake_up``'s swap, applied from the recorded rules."""
    for name, param in list(model.named_parameters()):
        rule = rule_for(name)
        if rule is not None and param.shape[rule.kernel_hidden_dim] == hidden:
            owner, _, leaf = name.rpartition(".")
            view = torch.nn.Parameter(param.transpose(*rule.dims), requires_grad=False)
            setattr(model.get_submodule(owner), leaf, view)


def _experts(worker: Any) -> Experts:
    experts: Experts = worker.model_runner.model.layers[0].experts
    return experts


def _kernel_memory(worker: Any) -> dict[str, int]:
    return {n: p.untyped_storage().data_ptr() for n, p in _experts(worker).named_parameters()}


# (hidden, expert width): the defect's H != 2I ((8, 8) also has H == I), and (8, 4) with H == 2I,
# where w13's two layouts have one shape and only contiguity tells them apart.
SHAPES = [(8, 3), (8, 8), (6, 5), (8, 4)]


def test_the_recorded_rules_are_wake_ups() -> None:
    assert [(r.name, r.kernel_hidden_dim, r.dims) for r in ASCEND_WAKE_UP_TRANSPOSES] == [
        ("w2_weight", 2, (1, 2)),
        ("w13_weight", 1, (1, 2)),
    ]


@pytest.mark.parametrize(("hidden", "width"), SHAPES)
def test_the_reload_after_wake_up_fails_without_the_restore(hidden: int, width: int) -> None:
    """What a refresh did before the fix: the layerwise reload copies the kernel layout into
    wake_up's views."""
    worker = _worker(hidden, width)
    ascend_wake_up(worker.model_runner.model, hidden)
    with pytest.raises(RuntimeError, match="must match the size"):
        worker.model_runner.reload_weights(weights_iterator=_weights(hidden, width, seed=1).items())


@pytest.mark.parametrize(("hidden", "width"), SHAPES)
def test_each_refresh_after_wake_up_lands_in_the_kernel_layout_in_place(hidden: int, width: int) -> None:
    worker = _worker(hidden, width)
    memory = _kernel_memory(worker)
    for seed in (1, 2):  # two sleep / wake-up / push cycles
        ascend_wake_up(worker.model_runner.model, hidden)
        new = _weights(hidden, width, seed=seed)
        reload_through_model_runner(worker, weights_iterator=new.items())
        experts = _experts(worker)
        for name, param in experts.named_parameters():
            expected = new[f"layers.0.experts.{name}"].transpose(1, 2)
            assert param.is_contiguous(), name  # the kernel layout, as the forward reads it
            torch.testing.assert_close(param.data, expected, rtol=0, atol=0, msg=name)
        # The same memory as at start-up: vLLM's sleep-mode pool, which the next sleep frees.
        assert _kernel_memory(worker) == memory


def test_without_a_wake_up_the_restore_changes_nothing() -> None:
    """A reload with no wake-up before it (a CPU host, an engine that never slept)."""
    worker = _worker(8, 4)  # H == 2I: the shapes of w13 alone cannot tell the layouts apart
    before = dict(_experts(worker).named_parameters())
    assert restore_kernel_layout(worker.model_runner.model, 8) == []
    assert dict(_experts(worker).named_parameters()) == before
    new = _weights(8, 4, seed=3)
    reload_through_model_runner(worker, weights_iterator=new.items())
    torch.testing.assert_close(
        _experts(worker).w13_weight.data, new["layers.0.experts.w13_weight"].transpose(1, 2)
    )


def test_a_quantized_model_is_left_alone() -> None:
    """wake_up swaps only when quant_config is None; the restore keeps to the same condition."""
    worker = _worker(8, 3, quantized=True)
    ascend_wake_up(worker.model_runner.model, 8)  # as if it had: the restore still must not touch it
    views = dict(_experts(worker).named_parameters())
    assert restore_worker_kernel_layout(worker) == []
    assert dict(_experts(worker).named_parameters()) == views


def _names(model: torch.nn.Module) -> Iterator[str]:
    return (name for name, _ in model.named_parameters())


def test_the_restore_names_what_it_swapped() -> None:
    worker = _worker(8, 3)
    model = worker.model_runner.model
    ascend_wake_up(model, 8)
    assert sorted(restore_kernel_layout(model, 8)) == sorted(_names(model))
