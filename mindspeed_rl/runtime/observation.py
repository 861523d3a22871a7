"""The one read-out of a ``ControlLoop``: a frozen record of the numbers outsiders report.

::

    ControlLoop.observe(arrivals_since=i, lag_steps_since=j) ──► LoopObservation
        ├─► runtime.summary.build_summary      (summary.json's control-plane part)
        ├─► runtime.step_metrics.step_metrics  (one digest per trainer step, with the event log)
        └─► sim.result.build_result            (Table 4b, lag report, duty cycle)

Readers get values, never the loop's parts, so the parts can change shape without breaking
them, and nothing here imports the controller (the read-out sits below its users).
"""

from __future__ import annotations

from dataclasses import dataclass

from mindspeed_rl.runtime.lag import StepLag
from mindspeed_rl.runtime.timings import WeightFlowTimings
from mindspeed_rl.runtime.training_queue import QueueArrival


@dataclass(frozen=True, slots=True, kw_only=True)
class ActorObservation:
    gu_id: int
    actor_id: int
    num_minibatches: int
    num_reloads: int
    generating_seconds: float
    loading_seconds: float
    duty_cycle: float | None
    """η = generating ÷ (generating + loading), the paper's definition (App. D.6)."""
    busy_fraction: float | None
    """generating ÷ wall time since the actor's first work, at ``LoopObservation.time``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopObservation:
    time: float
    """The loop's clock when observed."""
    # ---- schedule and ingest
    prompts_scheduled: int
    prompts_consumed: int
    minibatches_scheduled: int
    minibatches_completed: int
    minibatches_reissued: int
    duplicate_minibatches_dropped: int
    superseded_completions_dropped: int
    minibatches_per_gu: dict[int, int]
    """Assignments sent to each GU, re-issues included."""
    # ---- trainer and lag
    train_steps: int
    """Global batches handed to the trainer."""
    max_policy_lag_limit: int | None
    max_policy_lag_measured: int | None
    mean_policy_lag_measured: float | None
    mean_policy_lag_eq4_estimate: float | None
    num_lag_steps: int
    """Length of the per-step lag log; ``lag_steps`` is its tail from ``lag_steps_since``."""
    lag_steps: tuple[StepLag, ...]
    trainer_lag_holds: int
    """Times a global batch was ready but held back to keep a due prompt's deadline."""
    starts_refused: dict[str, int]
    """Refused ``request_start`` calls by reason (GUs retry, so these count requests)."""
    # ---- Training Queue and backpressure
    queue_depth_samples: int
    max_queue_depth_samples: int
    queue_limit_samples: int
    queue_resume_samples: int
    num_arrivals: int
    """Length of the arrival log; ``arrivals`` is its tail from ``arrivals_since``."""
    arrivals: tuple[QueueArrival, ...]
    paused: bool
    num_backpressure_pauses: int
    seconds_paused: float
    # ---- weight flow and actors
    latest_version: int
    reloads_not_newest: int
    partial_samples_total: int
    partial_segments_total: int
    max_segments_per_sample: int
    timings: WeightFlowTimings | None
    """Mean durations of Eq. 4's terms; ``None`` until a generation and a train step are measured."""
    mean_train_seconds: float | None
    actors: tuple[ActorObservation, ...]
    queue_bound_samples: int = 0
    """The queue's provable worst case: ``Q_max`` plus one largest minibatch (all its samples)
    per registered actor, since backpressure stops new starts but not the ones already running."""
    queue_routing_bytes: int = 0
    """MoE routing replay (R3): bytes of routing records the queued samples carry now."""
    max_queue_routing_bytes: int = 0
    routing_bytes_per_sample: float | None = None
    """Mean routing bytes of the samples handed to the trainer; None before the first step."""
    minibatches_timed_out: int = 0
    minibatch_errors: int = 0
    """Attempts whose engine raised inside generate."""
    actor_deaths: int = 0
    actor_restarts: int = 0
    """Every actor that did work, ordered by (GU, actor)."""
