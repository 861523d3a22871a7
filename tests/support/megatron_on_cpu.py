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


@contextlib.contextmanager
def megatron_optimizers_on_cpu() -> Iterator[None]:
    """The engine's CPU runtime shims plus :class:`CudaTypeNames`, and the engine building and
    stepping megatron's optimizer (``get_megatron_optimizer``) as on an accelerator."""
    from mindspeed_rl.models.training.megatron import engine

    original = engine.uses_megatron_optimizer
    engine.uses_megatron_optimizer = lambda: True  # type: ignore[assignment]
    try:
        with patches.cpu_runtime_mode(), CudaTypeNames():
            yield
    finally:
        engine.uses_megatron_optimizer = original  # type: ignore[assignment]
