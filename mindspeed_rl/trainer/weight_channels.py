"""Start of an async run's weight flow, before any generation engine starts: the shared-path
probe, then (``weight_transport: collective``) one process group per Generation Unit.

::

    TU.write_probe(<snapshot root>)  ─► probe file + token
    GU g.check_probe(probe)          ─► shared_fs and not visible on g's node: SharedPathError (run stops)
    probe removed                        (no file is left under snapshot_dir but checkpoints)
    collective: GU g.open_weight_channel(R + 1, backend) ─► address; the TU ranks join at their first
                export (backend: ``AsyncSpec.collective_backend``, resolved from the config)

The TU writes the probe once its constructor has run (the trainer's model is loaded by then: the
probe comes from the TU's own process, so it names the TU's node, not the driver's); the GUs
check it before their actors (vLLM engines) start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from mindspeed_rl.contracts import TrainerSpec
    from mindspeed_rl.plan.sections import AsyncSpec


def sending_ranks(trainer: TrainerSpec | None) -> int:
    """TU ranks that export a shard (TP x PP x EP; data-parallel replicas send nothing)."""
    if trainer is None:
        return 1
    layout = trainer.layout_summary()
    return layout["tp"] * layout["pp"] * layout["ep"]


def start_weight_flow(
    tu: Any, gus: dict[int, Any], spec: AsyncSpec, trainer: TrainerSpec | None, snapshots: Path
) -> dict[str, Any]:
    """Probe, then open the channels; returns the keywords of ``TrainingUnit.enable_snapshots``."""
    import ray

    from mindspeed_rl.weights.transport import remove_probe
    from mindspeed_rl.weights.transports import transport_for

    probe = ray.get(tu.write_probe.remote(str(snapshots)))
    try:
        ray.get([gu.check_probe.remote(probe) for gu in gus.values()])
    except ray.exceptions.RayTaskError as err:
        raise err.cause from None  # SharedPathError: its message names the key and the node
    finally:
        remove_probe(probe)
    kwargs: dict[str, Any] = {"transport": spec.weight_transport}
    if spec.weight_delta is not None:
        kwargs["delta"] = spec.weight_delta
    if transport_for(spec.weight_transport).opens_channels:
        world = sending_ranks(trainer) + 1
        backend = spec.collective_backend
        kwargs["channels"] = tuple(
            ray.get([gu.open_weight_channel.remote(world, backend) for gu in gus.values()])
        )
        kwargs["bucket_mb"] = spec.bucket_mb
    return kwargs
