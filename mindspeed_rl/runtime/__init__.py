"""Control logic of the asynchronous pipeline, in plain Python (no Ray, no torch).

The Ray workers (``mindspeed_rl.workers``) and the simulator (``mindspeed_rl.sim``) both drive
``ControlLoop``; see ``controller.py`` for the flow.
"""

from mindspeed_rl.runtime.clock import Clock, FakeClock, MonotonicClock
from mindspeed_rl.runtime.config import RuntimeConfig
from mindspeed_rl.runtime.controller import ControlLoop
from mindspeed_rl.runtime.errors import ProtocolError
from mindspeed_rl.runtime.events import EventLog
from mindspeed_rl.runtime.ingestor import IngestOutcome
from mindspeed_rl.runtime.records import (
    Assignment,
    CompletedMinibatch,
    GlobalBatch,
    PromptGroup,
    Sample,
    ScheduledMinibatch,
    SnapshotInfo,
    StartDecision,
    StartRefusal,
)
from mindspeed_rl.runtime.summary import RuntimeSummary

__all__ = [
    "Assignment",
    "Clock",
    "CompletedMinibatch",
    "ControlLoop",
    "EventLog",
    "FakeClock",
    "GlobalBatch",
    "IngestOutcome",
    "MonotonicClock",
    "PromptGroup",
    "ProtocolError",
    "RuntimeConfig",
    "RuntimeSummary",
    "Sample",
    "ScheduledMinibatch",
    "SnapshotInfo",
    "StartDecision",
    "StartRefusal",
]
