"""The export contract every weight transport shares, written once.

::

    export(v, named_tensors, layout, rank)        trainer thread
        │  versions increase per rank; the rank must be in the layout
        │  select this rank's tensors (replicas: coordinate 0 of each axis writes)
        │  drop a still-queued older export of this rank (superseded), THEN make the copy
        ▼
    one-slot queue per rank ──► [one publisher thread, exports in version order]
        │  the medium publishes: shard files (shared_fs), ray.put refs (object_store),
        │  bucketed sends (collective)
        ▼
    Future[ExportResult]

Why "drop, then copy" is atomic (``_export_lock``): host memory then never holds more than the
copy being published plus one queued copy per rank, even when publishing is slower than a
training step. The Control Unit tolerates the skipped versions: actors always reload to the
newest. A transport is a subclass that supplies the copy (``_payload``), the publish
(``_publish``) and what a superseded payload lets go (``_release``); the queue, the futures and
the writer thread are here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from mindspeed_rl.weights.layout import TrainingLayout

__all__ = ["ExportQueue", "Pending", "select_tensors"]

logger = logging.getLogger(__name__)
P = TypeVar("P")


@dataclass(slots=True, eq=False)  # compared by identity: the payload holds tensors or refs
class Pending(Generic[P]):
    version: int
    rank: int
    layout: TrainingLayout
    payload: P | None  # None once published or superseded, so the copy is freed then
    num_tensors: int
    skipped: int
    prepare_seconds: float
    started: float
    future: Future[Any]


def select_tensors(
    version: int, named_tensors: Iterable[tuple[str, torch.Tensor]], layout: TrainingLayout, rank: int
) -> tuple[list[tuple[str, torch.Tensor]], int]:
    """The tensors rank ``rank`` exports (replicated tensors only from coordinate 0 of each axis,
    see ``TrainingLayout.writes``) and how many were skipped as replicas."""
    coords = layout.coords(rank)
    chosen: list[tuple[str, torch.Tensor]] = []
    seen: set[str] = set()
    skipped = 0
    for name, tensor in named_tensors:
        if name in seen:
            raise ValueError(f"tensor {name!r} was given twice for snapshot v{version}; names must be unique")
        seen.add(name)
        if tensor.device.type != "cpu":
            raise ValueError(f"tensor {name!r} is on {tensor.device}; move it to CPU before export")
        if not layout.writes(layout.spec_for(name), coords):
            skipped += 1
            continue
        chosen.append((name, tensor))
    return chosen, skipped


class ExportQueue(Generic[P]):
    """``export`` / ``wait`` / ``close`` / ``num_superseded`` over a transport's three hooks.

    Subclasses call ``super().__init__(thread_name=...)`` last, once their own state exists:
    the publisher thread starts there."""

    _closed_hint = "create a new exporter"

    def __init__(self, *, thread_name: str) -> None:
        self.num_superseded = 0
        self._cond = threading.Condition()
        self._queue: list[Pending[P]] = []
        self._submitted: list[Future[Any]] = []
        self._last_version: dict[int, int] = {}
        self._closed = False
        self._export_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    # ---- the transport's hooks ------------------------------------------------------------------
    def _payload(
        self, version: int, chosen: list[tuple[str, torch.Tensor]], layout: TrainingLayout, rank: int
    ) -> P:
        """The export's one copy, on the trainer's thread (the next step overwrites the tensors)."""
        raise NotImplementedError

    def _publish(self, pending: Pending[P]) -> Any:
        """Publish on the writer thread; returns the ``ExportResult``."""
        raise NotImplementedError

    def _release(self, pending: Pending[P]) -> None:
        """A newer export replaced this queued one: let go of what only it holds."""

    def _superseded(self, pending: Pending[P]) -> Any:
        """The ``ExportResult`` of a superseded export (nothing published)."""
        raise NotImplementedError

    # ---- the contract ---------------------------------------------------------------------------
    def export(
        self,
        version: int,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        layout: TrainingLayout,
        rank: int = 0,
    ) -> Future[Any]:
        """Copy this rank's tensors now, publish them in the background; the future's result is
        an ``ExportResult`` (``superseded=True`` if a newer export replaced it while queued)."""
        if version < 0:
            raise ValueError(f"snapshot version {version} is negative; use the trainer step (>= 0)")
        with self._export_lock:
            last = self._last_version.get(rank)
            if last is not None and version <= last:
                raise ValueError(
                    f"snapshot v{version} of rank {rank} after v{last}: policy versions must increase, "
                    f"export version {last + 1} or later"
                )
            started = time.perf_counter()
            # Bad input (a rank outside the layout, a duplicate name) raises here, before the
            # queued export is superseded.
            chosen, skipped = select_tensors(version, named_tensors, layout, rank)
            self._supersede_queued(rank)
            payload = self._payload(version, chosen, layout, rank)
            pending = Pending(
                version=version,
                rank=rank,
                layout=layout,
                payload=payload,
                num_tensors=len(chosen),
                skipped=skipped,
                prepare_seconds=time.perf_counter() - started,
                started=started,
                future=Future(),
            )
            del chosen
            with self._cond:
                if self._closed:
                    raise RuntimeError(f"{type(self).__name__}.export after close(); {self._closed_hint}")
                self._last_version[rank] = version
                self._queue.append(pending)
                self._submitted = [f for f in self._submitted if not f.done()] + [pending.future]
                self._cond.notify_all()
        return pending.future

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Block until every export submitted so far is published or superseded (re-raises a
        failed publish)."""
        with self._cond:
            pending, self._submitted = self._submitted, []
        return [f.result(timeout=timeout) for f in pending]

    def close(self) -> None:
        """Publish what is queued, then stop the writer thread; re-raises a failed publish."""
        try:
            self.wait()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._thread.join()

    def _supersede_queued(self, rank: int) -> None:
        with self._cond:
            older = [p for p in self._queue if p.rank == rank]
            self._queue = [p for p in self._queue if p not in older]
            self.num_superseded += len(older)
        for pending in older:
            self._release(pending)
            pending.payload = None  # the copy goes now, before the new one is made
            logger.info(
                "snapshot v%d of rank %d superseded by a newer export while queued", pending.version, rank
            )
            pending.future.set_result(self._superseded(pending))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                pending = self._queue.pop(0)
            try:
                result = self._publish(pending)
            except Exception as err:  # handed to the caller through the future
                pending.payload = None
                pending.future.set_exception(err)
            else:
                pending.payload = None
                pending.future.set_result(result)
