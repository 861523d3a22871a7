"""Control logic of the asynchronous pipeline, in plain Python (no Ray, no torch).

The Ray workers (``mindspeed_rl.workers``) and the simulator (``mindspeed_rl.sim``) both drive
``ControlLoop``; see ``controller.py`` for the flow. The protocol an adapter follows:

* Start-up: ``register_gu`` every GU, then ``dispatch()`` and send each ``Assignment`` to its GU.
* GU control process: a ``GuPolicy`` (``gu_policy.py``) holds the input queue and the actor
  slots, chooses which published snapshot to convert, and for each idle actor decides to
  reload, start (after ``request_start(...)`` with the version the actor holds), wait or drop a
  revoked entry. Every GU driver (the Ray GU, the simulator, the tests' fake) runs that object.
* When an actor finishes: ``on_minibatch_completed(...)``, then ``dispatch()`` again.
* Faults: ``on_actor_failed`` / ``on_gu_failed`` (once per death), then ``dispatch()``.
* Trainer: ``pop_global_batch(step)`` until it returns a batch, train, then
  ``on_train_step_done(step, snapshot)``; weight-flow timings via ``on_snapshot_converted`` (with
  ``at=`` the time the conversion ended, if it is reported later) and ``on_weights_loaded``.
  Read-outs: ``observe()`` (a ``LoopObservation``), ``summary()``, ``has_idle_actor(gu)``.

An adapter may batch these calls, as the Ray ControlUnit does (``ControlUnit.exchange``: one
GU's completions, then its reload and conversion reports, then one ``request_start``), as long
as it applies them in that order: an actor's completion before its reload, both before its next
start.
"""

from mindspeed_rl.runtime.clock import Clock, FakeClock, MonotonicClock, WallClock
from mindspeed_rl.runtime.config import RuntimeConfig
from mindspeed_rl.runtime.controller import ControlLoop
from mindspeed_rl.runtime.errors import ProtocolError
from mindspeed_rl.runtime.events import EventLog
from mindspeed_rl.runtime.gu_policy import GuPolicy
from mindspeed_rl.runtime.ingestor import IngestOutcome
from mindspeed_rl.runtime.observation import LoopObservation
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
    "GuPolicy",
    "IngestOutcome",
    "LoopObservation",
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
