"""megatron-core's optimizers built and stepped on a CPU host, for tests.

``get_megatron_optimizer`` builds on the engine's CPU shims (``patches.cpu_runtime_mode``: the
``device="cuda"`` tensors its optimizers allocate land on the CPU), except for one check: its
mixed-precision optimizers (``Float16OptimizerWithFloat16Params``, ``DistributedOptimizer``; and
the gradient-norm code) accept a tensor only if ``tensor.type()`` names a CUDA type
(megatron-core 0.12.1 and 0.19.2, optimizer/optimizer.py, distrib_optimizer.py, clip_grads.py).
:class:`CudaTypeNames` answers that one question for CPU tensors as a CUDA device would; every
other line of megatron's classes runs as it would on a device. A stand-in for the device, for
tests only: the engine itself steps its CPU optimizer on a CPU host (``megatron/optimizer.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from mindspeed_rl.models.training.megatron import patches


class CudaTypeNames(patches.CudaDeviceToCpu):
    """``patches.CudaDeviceToCpu``, and ``tensor.type()`` of a CPU tensor named as on CUDA."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func is torch.Tensor.type and len(args) == 1 and not kwargs and args[0].device.type == "cpu":
            return str(func(*args)).replace("torch.", "torch.cuda.", 1)
        return super().__torch_function__(func, types, args, kwargs)


def _no_fp8_shards(model_params: Any, *args: Any, **kwargs: Any) -> None:
    """What TransformerEngine's ``quantize_param_shard`` does with no fp8 parameters: nothing."""
    if len(model_params):
        raise RuntimeError("fp8 parameter shards need TransformerEngine")


@contextlib.contextmanager
def megatron_optimizers_on_cpu() -> Iterator[None]:
    """The engine's CPU runtime shims plus :class:`CudaTypeNames`, and the engine building and
    stepping megatron's optimizer (``get_megatron_optimizer``) as on an accelerator.

    megatron-core 0.12.1's ``DistributedOptimizer`` also calls ``fp8_utils.quantize_param_shard``
    on every step (distrib_optimizer.py:2019), whose fallback without TransformerEngine raises even
    with no fp8 parameter (fp8_utils.py:297-302); where it does, it is replaced by what TE's does
    with none (0.19.2's needs no stand-in)."""
    from megatron.core import fp8_utils
    from megatron.core.optimizer import distrib_optimizer

    from mindspeed_rl.models.training.megatron import engine

    original = engine.uses_megatron_optimizer, distrib_optimizer.quantize_param_shard
    try:
        fp8_utils.quantize_param_shard([], [], [], None)
    except RuntimeError:
        distrib_optimizer.quantize_param_shard = _no_fp8_shards  # type: ignore[assignment]
    engine.uses_megatron_optimizer = lambda: True  # type: ignore[assignment]
    try:
        with patches.cpu_runtime_mode(), CudaTypeNames():
            yield
    finally:
        engine.uses_megatron_optimizer, distrib_optimizer.quantize_param_shard = original  # type: ignore[assignment]
