"""Control logic of the asynchronous pipeline, in plain Python (no Ray, no torch).

The Ray workers (``mindspeed_rl.workers``) and the simulator (``mindspeed_rl.sim``) both drive
``ControlLoop``; see ``controller.py`` for the flow. The protocol an adapter follows:

* Start-up: ``register_gu`` every GU, then ``dispatch()`` and send each ``Assignment`` to its GU.
* GU control process, for each idle actor and the head of its input queue: skip while
  ``pause_signal()``; reload first if ``latest_snapshot()`` is newer than the actor's weights;
  then ``request_start(...)`` with the version the actor holds. On refusal: ``BACKPRESSURE`` —
  wait for the signal to clear; ``POLICY_LAG`` — retry after the next trainer step or reload;
  ``STALE_WEIGHTS`` — wait for a newer snapshot and reload; ``REVOKED`` — drop that entry.
* When an actor finishes: ``on_minibatch_completed(...)``, then ``dispatch()`` again.
* Faults: ``on_actor_failed`` / ``on_gu_failed`` (once per death), then ``dispatch()``.
* Trainer: ``pop_global_batch(step)`` until it returns a batch, train, then
  ``on_train_step_done(step, snapshot)``; weight-flow timings via ``on_snapshot_converted`` and
  ``on_weights_loaded``. ``summary()`` at the end.
"""

from mindspeed_rl.runtime.clock import Clock, FakeClock, MonotonicClock, WallClock
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
    "WallClock",
]
