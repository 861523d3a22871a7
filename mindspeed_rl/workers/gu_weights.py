"""A Generation Unit's side of the weight flow: its transport's GU end (``weights.transports``,
made once), the start-of-run probe, and each snapshot's conversion
with the CPU it costs. The GU's control loop only schedules these (``generation_unit.py``); the
CPU is kept apart because the summary reports the control plane's CPU without the conversions'."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mindspeed_rl.weights.collective_backend import Backend
from mindspeed_rl.workers.gu_spec import ConversionDone, GuSpec

logger = logging.getLogger(__name__)


class GuWeightSide:
    def __init__(self, spec: GuSpec) -> None:
        from mindspeed_rl.weights.layout import InferenceLayout
        from mindspeed_rl.weights.transports import transport_for

        self.spec = spec
        # Made here, once: the GU's threads (its loop, conversions, actors' mid-decode questions)
        # all read the same endpoint, whose memory handles a second one would not know. The torch
        # backend's inference layout is one full replica per actor (TP = EP = 1).
        self.transport = transport_for(spec.weight_transport)
        self.endpoint = self.transport.gu_end(
            Path(spec.cache_dir), InferenceLayout(), delta=spec.weight_delta, gu_id=spec.gu_id
        )
        self.convert_cpu_seconds = 0.0
        """CPU of the conversion threads since ``reset_cpu`` (weight flow, not control)."""

    def reset_cpu(self) -> None:
        self.convert_cpu_seconds = 0.0

    def check_probe(self, probe: Any) -> str:
        """Before any model work: does this node see the TU's snapshot folder? Raises
        ``SharedPathError`` for shared_fs where it does not; returns this node's name."""
        import socket

        from mindspeed_rl.weights.transport import check_probe

        # The GU's own path to the snapshot root: its cache folder's parent (``gu_specs``).
        folder = Path(self.spec.cache_dir).parent
        seen = check_probe(
            probe,
            shared_folder=self.transport.needs_shared_folder,
            folder=folder,
            where=f"Generation Unit {self.spec.gu_id}",
        )
        return f"{socket.gethostname()} (probe {'seen' if seen else 'not seen'})"

    def open_channel(self, world_size: int, backend: Backend) -> Any:
        """collective: this GU's one process group (on ``backend``), opened once at start."""
        return self.endpoint.open_channel(self.spec.gu_id, world_size, backend)

    def bind_receiver_device(self, actor: Any) -> None:
        """NCCL / HCCL channel: receive on the device of ``actor`` (this GU's first generation
        actor), which must share this GU's node (``async_cluster`` schedules the GU in its
        placement bundle). No effect on gloo or without a channel. NOT RUN on this host."""
        import ray

        from mindspeed_rl.utils.devices import kind_of_backend

        receiver = self.endpoint.receiver
        kind = None if receiver is None else kind_of_backend(receiver.address.backend)
        if receiver is None or kind is None:
            return
        node, assigned = ray.get(actor.__ray_call__.remote(_node_and_devices, kind))
        here = ray.get_runtime_context().get_node_id()
        self.endpoint.bind_receiver_device(
            receiver_device_index(receiver.address.backend, self.spec.gu_id, here, node, assigned, os.environ)
        )

    def convert(self, version: int, path: str, handle: Any = None) -> ConversionDone:
        """Convert one published snapshot; a defective one is logged and reported with no path."""
        from mindspeed_rl.weights.manifest import SnapshotError

        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            result = self.endpoint.convert(version, path, handle)
        except SnapshotError as err:  # the endpoint has logged it; actors keep their weights
            logger.error(
                "GU %d: snapshot v%d rejected (%s); actors keep their weights", self.spec.gu_id, version, err
            )
            return ConversionDone(version=version, path=None, seconds=time.perf_counter() - started)
        finally:
            # Only this thread's CPU: the converter's own reader threads (num_threads=1 here) aside.
            self.convert_cpu_seconds += time.thread_time() - cpu_started
        return ConversionDone(version=version, path=result.path, seconds=result.seconds, delta=result.metrics)

    def delta_stats(self) -> dict[str, float]:
        """``weight_delta`` auto / on: this GU's totals (applied refreshes, apply seconds, resends)."""
        return self.endpoint.delta_stats()

    def reload_handle(self, path: str) -> Any:
        """What an actor reloading ``path`` is handed beside it: a memory snapshot, or None (a folder)."""
        return self.endpoint.reload_handle(path)


def _node_and_devices(actor: Any, kind: str) -> tuple[str, list[str]]:
    """Run inside a generation actor (``__ray_call__``): its node and its devices of ``kind``."""
    import ray

    context = ray.get_runtime_context()
    return context.get_node_id(), [str(i) for i in context.get_accelerator_ids().get(kind, [])]


def receiver_device_index(
    backend: Backend,
    gu_id: int,
    gu_node: str,
    actor_node: str,
    assigned: Sequence[str],
    env: Mapping[str, str],
) -> int:
    """The device index, in the GU process's own view (``env``: its visible-devices variable),
    of its first generation actor's first device. Raises naming the key when they do not share
    a node (no device of that actor's is reachable from the GU then)."""
    from mindspeed_rl.utils.devices import VISIBLE_DEVICES_ENV, device_index, kind_of_backend
    from mindspeed_rl.weights.collective_backend import KEY

    if gu_node != actor_node:
        raise ValueError(
            f"{KEY}={backend}: Generation Unit {gu_id} runs on node {gu_node} but its first generation "
            f"actor on node {actor_node}; the GU receives the weights on that actor's device, so they "
            f"must share a node; set {KEY}: gloo to receive them in host memory instead"
        )
    kind = kind_of_backend(backend)
    assert kind is not None, "gloo needs no device"
    raw = env.get(VISIBLE_DEVICES_ENV[kind])
    visible = None if raw is None else tuple(v.strip() for v in raw.split(",") if v.strip())
    return device_index(assigned, visible)
