"""A Generation Unit's side of the weight flow: its transport's endpoint (``weights.endpoints.
GuWeights``, made once), the start-of-run probe, and each snapshot's conversion
with the CPU it costs. The GU's control loop only schedules these (``generation_unit.py``); the
CPU is kept apart because the summary reports the control plane's CPU without the conversions'."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from mindspeed_rl.workers.gu_spec import ConversionDone, GuSpec

logger = logging.getLogger(__name__)


class GuWeightSide:
    def __init__(self, spec: GuSpec) -> None:
        from mindspeed_rl.weights.endpoints import GuWeights
        from mindspeed_rl.weights.layout import InferenceLayout

        self.spec = spec
        # Made here, once: the GU's threads (its loop, conversions, actors' mid-decode questions)
        # all read the same endpoint, whose memory handles a second one would not know. The torch
        # backend's inference layout is one full replica per actor (TP = EP = 1).
        self.endpoint = GuWeights(spec.weight_transport, Path(spec.cache_dir), InferenceLayout())
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
            probe, self.spec.weight_transport, folder=folder, where=f"Generation Unit {self.spec.gu_id}"
        )
        return f"{socket.gethostname()} (probe {'seen' if seen else 'not seen'})"

    def open_channel(self, world_size: int) -> Any:
        """collective: this GU's one process group, opened once at start."""
        return self.endpoint.open_channel(self.spec.gu_id, world_size)

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
        return ConversionDone(version=version, path=result.path, seconds=result.seconds)

    def reload_handle(self, path: str) -> Any:
        """What an actor reloading ``path`` is handed beside it: a memory snapshot, or None (a folder)."""
        return self.endpoint.reload_handle(path)
