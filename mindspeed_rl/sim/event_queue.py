"""A heap of timestamped simulator events with a defined order for simultaneous ones.

Events at the same time are delivered as one batch, ordered by kind, then by the unit they
concern, then by insertion. Kind order (why): the weight flow first (a snapshot saved, converted
or loaded "at" t is visible to anything else that happens at t), then the trainer finishing a
step, then generation completions. The simulator reacts only after the whole batch is handled,
so the order mostly affects event-log order, not outcomes — but it is fixed, so a run is exactly
reproducible.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass


class EventKind(enum.IntEnum):
    SAVE_DONE = 0
    CONVERT_DONE = 1
    LOAD_DONE = 2
    TRAIN_DONE = 3
    GEN_DONE = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class SimEvent:
    time: float
    kind: EventKind
    unit: tuple[int, ...]
    """What the event concerns: ``(version,)``, ``(gu,)``/``(gu, version)``, ``(gu, actor)``,
    ``(step,)``; part of the tie-break so simultaneous events order the same way every run."""
    payload: object = None


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, tuple[int, ...], int, SimEvent]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, event: SimEvent) -> None:
        if event.time != event.time or event.time < 0:  # NaN or negative
            raise ValueError(f"event time must be a number >= 0, got {event.time}.")
        heapq.heappush(self._heap, (event.time, int(event.kind), event.unit, self._seq, event))
        self._seq += 1

    def pop_simultaneous(self) -> list[SimEvent]:
        """All events with the earliest timestamp, in delivery order (empty if none are left)."""
        if not self._heap:
            return []
        now = self._heap[0][0]
        batch = []
        while self._heap and self._heap[0][0] == now:
            batch.append(heapq.heappop(self._heap)[-1])
        return batch
