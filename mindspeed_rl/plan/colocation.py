"""The colocated hybrid's part of the plan: whether trainer and rollout engine share a process,
and the ``offload_train_*`` switches that then act."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mindspeed_rl.contracts import OffloadSpec
from mindspeed_rl.plan.placement import device_kind

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig

# Inert elsewhere, honoured where ``colocated_offload`` gives a spec (``sections.inert_keys``).
OFFLOAD_KEYS = frozenset(
    ("generate_config", f"offload_train_{part}") for part in ("optimizer", "grad", "param")
)


def colocated_offload(config: GRPOConfig) -> OffloadSpec | None:
    """The offload switches of upstream's colocated hybrid (GPU/NPU, ``pipeline: hybrid``, or CPU
    with ``rl_config.colocate``); None in the async pipeline and the CPU two-process hybrid, where
    trainer and rollout never share a process."""
    if config.rl_config.pipeline != "hybrid":
        if config.rl_config.colocate:
            raise ValueError(
                "rl_config.colocate: true is the hybrid loop's layout; the async pipeline gives its "
                "generation actors their own devices: set rl_config.pipeline: hybrid or colocate: false"
            )
        return None
    if device_kind(config)[0] is None:
        if not config.rl_config.colocate:
            return None
        if config.rl_config.rollout_backend != "vllm":
            raise ValueError(
                "rl_config.colocate: true puts a vLLM engine (rank) in the trainer's (rank) processes; "
                "set rl_config.rollout_backend: vllm, or leave colocate false (two processes)"
            )
    g = config.generate_config
    # Under MindSpeed's swap optimizer the state is on the host between steps already (its device
    # tensors are empty storage), so there is nothing for offload_train_optimizer to move.
    from mindspeed_rl.plan.sections import swaps_optimizer  # sections imports this module

    return OffloadSpec(
        optimizer=g.offload_train_optimizer and not swaps_optimizer(config),
        grad=g.offload_train_grad,
        param=g.offload_train_param,
    )
