"""A structured, append-only event log of the control plane.

Components append typed events with the time they happened; metrics, plots, the simulator and
the tests read them back by type. Events are small frozen records, so the log can be shipped
across Ray or written out as JSON lines (``asdict`` plus the class name).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from mindspeed_rl.runtime.append_log import AppendLog

if TYPE_CHECKING:
    from mindspeed_rl.runtime.records import CompletedMinibatch


@dataclass(frozen=True, slots=True, kw_only=True)
class MinibatchIssued:
    time: float
    minibatch_id: int
    gu_id: int
    attempt: int
    batch_group_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MinibatchStarted:
    time: float
    minibatch_id: int
    gu_id: int
    actor_id: int
    policy_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MinibatchReceived:
    """A completion reached the Ingestor; ``outcome`` says what was done with it."""

    time: float
    minibatch_id: int
    gu_id: int
    actor_id: int
    outcome: str
    """``accepted``, ``duplicate`` (already completed) or ``superseded`` (from a failed attempt)."""
    num_samples: int
    generation_seconds: float
    num_response_tokens: int = 0
    """Generated tokens over the minibatch's samples (a trace replay's group loads are read here)."""


def received(completed: CompletedMinibatch, outcome: str, now: float) -> MinibatchReceived:
    """The event of one completion reaching the Ingestor."""
    return MinibatchReceived(
        time=now,
        minibatch_id=completed.minibatch_id,
        gu_id=completed.gu_id,
        actor_id=completed.actor_id,
        outcome=outcome,
        num_samples=len(completed.samples),
        generation_seconds=completed.generation_seconds,
        num_response_tokens=sum(len(s.response_token_ids) for s in completed.samples),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MinibatchRequeued:
    time: float
    minibatch_id: int
    gu_id: int
    actor_id: int | None
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BackpressureChanged:
    time: float
    paused: bool
    depth_samples: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GlobalBatchPopped:
    time: float
    step: int
    num_prompts: int
    num_samples: int
    d_off_max: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainStepDone:
    time: float
    step: int
    train_seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotPublished:
    time: float
    version: int
    path: str
    save_seconds: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotConverted:
    time: float
    gu_id: int
    version: int
    seconds: float
    delta: dict[str, float] | None = None
    """``weight_delta`` auto / on: bytes sent, changed fraction, encode / apply seconds."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsLoaded:
    time: float
    gu_id: int
    actor_id: int
    version: int
    seconds: float
    newest_published: int
    """Newest published version when the load was reported."""
    newest_at_start: int | None = None
    """Newest published version when the GU chose the reload target; a reload should pick it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ActorFaulted:
    """An actor raised, hung past the minibatch timeout or died; ``replaced``: a fresh actor
    takes its slot (holding the initial weights until it reloads), else the slot is retired."""

    time: float
    gu_id: int
    actor_id: int
    kind: str
    detail: str
    replaced: bool


Event = (
    MinibatchIssued
    | MinibatchStarted
    | MinibatchReceived
    | MinibatchRequeued
    | BackpressureChanged
    | GlobalBatchPopped
    | TrainStepDone
    | SnapshotPublished
    | SnapshotConverted
    | WeightsLoaded
    | ActorFaulted
)

E = TypeVar("E")


class EventLog(AppendLog[Event]):
    """Append-only log of events, in the order they were appended.

    Positions are absolute (``len`` counts every event ever appended). A long run streams the log
    to a JSON-lines file (``write_new``) and drops what both the file and the metric digest have
    read (``trim``), so memory holds about one trainer step of events, not the whole run.
    """

    def __init__(self) -> None:
        super().__init__()
        self._written = 0  # absolute position up to which write_new has written

    def of_type(self, kind: type[E]) -> list[E]:
        return [e for e in self if isinstance(e, kind)]

    def write_new(self, handle: TextIO) -> int:
        """Append the events not written yet to ``handle`` as JSON lines; returns how many."""
        new = self.since(self._written)
        handle.writelines(json.dumps(self.to_json_dict(e)) + "\n" for e in new)
        handle.flush()
        self._written += len(new)
        return len(new)

    def trim(self, before: int) -> None:
        """Forget events before position ``before`` that are already written (readers past them)."""
        super().trim(min(before, self._written))

    @staticmethod
    def to_json_dict(event: Event) -> dict[str, Any]:
        record = {"event": type(event).__name__, **asdict(event)}
        if isinstance(event, SnapshotConverted) and event.delta is None:
            del record["delta"]  # weight_delta off: the line is what it was before the field
        return record
