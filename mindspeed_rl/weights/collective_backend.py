"""Which process-group backend ``weight_transport: collective`` runs on (``async_config.collective_backend``).

::

    collective_backend   CPU-only run   GPU run   NPU run
    auto                 gloo           nccl      hccl      (gloo where the generation actors
    gloo                 gloo           gloo      gloo       run on CPU beside device trainers)
    nccl                 refused        nccl      refused   (gloo: host memory, over TCP)
    hccl                 refused        refused   hccl

The choice is resolved once, when the run plan is built (the device kind is known there, from the
config's ``num_gpus`` / ``num_npus``), into a :data:`Backend` that travels typed to the GUs'
channel addresses. gloo moves CPU tensors; NCCL and HCCL move device tensors, so a TU rank sends
from its device and the GU receives on the device of its first generation actor
(``CollectiveGu.bind_receiver_device``, weights/transports/collective.py), so a device backend also needs the generation actors on
devices. Torch-free.
"""

from __future__ import annotations

from typing import Literal, get_args

from mindspeed_rl.utils.placement import DeviceKind

Backend = Literal["gloo", "nccl", "hccl"]
BackendChoice = Literal["auto", "gloo", "nccl", "hccl"]
KEY = "async_config.collective_backend"
NATIVE: dict[DeviceKind | None, Backend] = {None: "gloo", "GPU": "nccl", "NPU": "hccl"}
"""What ``auto`` picks per device kind (None: a CPU-only run)."""
RUNS_ON: dict[Backend, DeviceKind | None] = {"gloo": None, "nccl": "GPU", "hccl": "NPU"}
"""The device a backend's tensors live on (None: host memory, any run)."""
BUCKET_DEVICE: dict[Backend, str] = {"gloo": "cpu", "nccl": "cuda", "hccl": "npu"}
"""The torch device type of a backend's send and receive buckets."""


def resolve_backend(
    choice: BackendChoice, device_kind: DeviceKind | None, why: str = "", *, actors_on_device: bool = True
) -> Backend:
    """The backend ``choice`` means on a run of ``device_kind`` (see the table); ``why`` says
    which keys chose the device kind, for the refusal; ``actors_on_device``: whether the
    generation actors hold devices (the GU receives on one). Raises ValueError naming the key."""
    if choice not in get_args(BackendChoice):
        raise ValueError(f"{KEY}={choice!r} is unknown; use one of {', '.join(get_args(BackendChoice))}")
    if choice == "auto":
        return NATIVE[device_kind] if actors_on_device else "gloo"
    backend: Backend = choice
    needs = RUNS_ON[backend]
    if needs is not None and needs == device_kind and not actors_on_device:
        raise ValueError(
            f"{KEY}={backend}, but async_config.actor_resources asks no {needs}s: the generation actors "
            f"run on CPU and the GU receives on its first actor's device; give the actors {needs}s, "
            f"or set {KEY} to gloo or auto"
        )
    if needs is None or needs == device_kind:
        return backend
    where = "a CPU-only run" if device_kind is None else f"a {device_kind} run"
    because = f" ({why})" if why else ""
    fix = "gloo or auto" if device_kind is None else f"{NATIVE[device_kind]}, gloo or auto"
    raise ValueError(
        f"{KEY}={backend} on {where}{because}: {backend} moves {needs} tensors, so it needs "
        f"{needs}s for the trainer and the generation actors; set {KEY} to {fix}"
    )
