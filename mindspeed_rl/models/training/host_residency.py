"""A frozen module whose weights live on the host except while it runs (:class:`HostResidency`).

The reference policy is used once per iteration (its log-prob pass) and never trained, so its
weights need not occupy the device through the training step, whose activations and optimizer
state are the trainer's peak. Upstream MindSpeed-RL's integrated worker (the default,
``rl_config.use_integrated_worker: true``) does exactly this: it offloads the reference's
parameters after building it and brings them back around each reference log-prob pass, then
empties the allocator's cache. ``plan.memory`` counts the reference only in that pass when this is
on (``TrainerMemorySpec.reference_offloaded``).

Whole tensors move (``nn.Module.to``: parameters and buffers keep their identity, their ``data``
changes device), so whatever holds the module keeps valid references. On a CPU-only run host and
device are the same and the moves are no-ops device-wise, but the same code runs and ``location``
records where the weights are meant to be.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch


class HostResidency:
    """``enabled``: the module leaves for ``host`` now and between every :meth:`resident` block;
    disabled, it stays where it was built and :meth:`resident` does nothing."""

    def __init__(self, module: torch.nn.Module, *, enabled: bool, host: str | torch.device = "cpu") -> None:
        self._module = module
        first = next(iter(module.parameters()), None)
        # The device the weights were built on (with its index): where every pass must find them.
        self.device = first.device if first is not None else torch.device("cpu")
        self.host = torch.device(host)
        self.enabled = enabled
        self.location: Literal["device", "host"] = "device"
        self.moves = 0
        """Offloads and onloads performed (bookkeeping for the run's metrics and tests)."""
        if enabled:
            self.offload()

    def offload(self) -> None:
        self._move(self.host)
        self.location = "host"
        if self.device.type in ("cuda", "npu"):
            # Return the freed blocks to the device, as upstream does after each offload: the
            # rollout engine (colocated) or the next step allocates from them. ``torch.npu`` is
            # registered by torch_npu, already imported when the weights are on an NPU.
            getattr(torch, self.device.type).empty_cache()

    def onload(self) -> None:
        self._move(self.device)
        self.location = "device"

    @contextmanager
    def resident(self) -> Iterator[None]:
        """The weights on the device for the block, back on the host after it (even on error)."""
        if not self.enabled:
            yield
            return
        self.onload()
        try:
            yield
        finally:
            self.offload()

    def _move(self, device: torch.device) -> None:
        torch.nn.Module.to(self._module, device)  # HF wraps .to with a decorator mypy cannot read
        self.moves += 1
