"""Which accelerator a Ray actor drives, from the ids Ray assigned it, bound before any collective.

Ray gives an actor that asks for GPUs or NPUs a set of physical device ids and, unless told not
to, narrows the process's view to them (``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES``).
The device an actor then uses is the position of its first assigned id among the visible ones:
0 under Ray's narrowing, the physical id where the visible list was left whole. Binding it
explicitly (``torch.cuda.set_device`` / ``torch.npu.set_device``) before ``init_process_group`` or
an engine start is what keeps every rank of a node off device 0, which is where NCCL/HCCL and
torch place tensors when nobody says otherwise.

torch_npu is imported only when an NPU is bound.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

AcceleratorKind = Literal["GPU", "NPU"]
VISIBLE_DEVICES_ENV = {"GPU": "CUDA_VISIBLE_DEVICES", "NPU": "ASCEND_RT_VISIBLE_DEVICES"}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceBinding:
    """What one actor was given and which device index it drives."""

    kind: AcceleratorKind
    assigned: tuple[str, ...]
    """Physical ids Ray assigned (``get_accelerator_ids()``)."""
    visible: tuple[str, ...] | None
    """The process's visible-devices variable, split; None when unset (every device visible)."""
    index: int
    """The torch device index of the first assigned device (``cuda:index`` / ``npu:index``)."""


def device_index(assigned: Sequence[str], visible: Sequence[str] | None) -> int:
    """Position of the first assigned id among the visible ones (its physical id if all are visible)."""
    if not assigned:
        raise ValueError("this actor was assigned no accelerator; its Ray options must ask for GPU/NPU")
    first = str(assigned[0])
    if visible is None:
        return int(first)
    if first not in visible:
        raise ValueError(
            f"assigned device {first} is not among the visible devices {list(visible)}; the runtime_env "
            "must let Ray set the visible devices (do not set RAY_EXPERIMENTAL_NOSET_*_VISIBLE_DEVICES "
            "together with a narrowed visible-devices variable)"
        )
    return list(visible).index(first)


def current_binding(kind: AcceleratorKind, env: Mapping[str, str] | None = None) -> DeviceBinding:
    """This Ray actor's devices of ``kind`` (inside a Ray worker only)."""
    import ray

    env = os.environ if env is None else env
    assigned = tuple(str(i) for i in ray.get_runtime_context().get_accelerator_ids().get(kind, []))
    raw = env.get(VISIBLE_DEVICES_ENV[kind])
    visible = None if raw is None else tuple(v.strip() for v in raw.split(",") if v.strip())
    return DeviceBinding(kind=kind, assigned=assigned, visible=visible, index=device_index(assigned, visible))


def bind_device(kind: AcceleratorKind) -> DeviceBinding:
    """Make this process's default device its first assigned one; returns what was bound."""
    binding = current_binding(kind)
    import torch

    if kind == "GPU":
        torch.cuda.set_device(binding.index)
    else:
        import torch_npu  # noqa: F401  (registers torch.npu)

        torch.npu.set_device(binding.index)  # type: ignore[attr-defined]
    return binding


def kind_of_backend(backend: str) -> AcceleratorKind | None:
    """The accelerator a collective backend runs on (gloo: none)."""
    return {"nccl": "GPU", "hccl": "NPU"}.get(backend)  # type: ignore[return-value]
