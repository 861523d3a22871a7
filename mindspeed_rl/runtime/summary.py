"""The end-of-run numbers of the control plane (the runtime's part of ``summary.json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mindspeed_rl.runtime.observation import ActorObservation, LoopObservation


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeSummary:
    prompts_scheduled: int
    prompts_consumed: int
    minibatches_scheduled: int
    minibatches_completed: int
    duplicate_minibatches_dropped: int
    superseded_completions_dropped: int
    minibatches_reissued: int
    train_steps: int
    """Global batches handed to the trainer."""
    max_policy_lag_measured: int | None
    max_policy_lag_limit: int | None
    mean_policy_lag_measured: float | None
    mean_policy_lag_eq4_estimate: float | None
    max_queue_depth_samples: int
    queue_limit_samples: int
    queue_resume_samples: int
    num_backpressure_pauses: int
    seconds_paused: float
    starts_refused: dict[str, int]
    """Refused ``request_start`` calls by reason; counts requests (GUs retry), not minibatches."""
    trainer_lag_holds: int
    """Times a global batch was ready but held back to keep a due prompt's deadline."""
    reloads_not_newest: int
    """Reloads that did not pick the newest snapshot published when they were chosen (should
    stay 0 on a real GU; the simulator does not report the choice time and counts every reload
    overtaken by a newer snapshot)."""
    partial_samples_total: int
    """Consumed samples whose response crossed a weight refresh (partial rollouts)."""
    partial_segments_total: int
    """Their segments (one per version that produced tokens), summed."""
    max_segments_per_sample: int
    minibatches_per_gu: dict[int, int]
    queue_bound_samples: int
    """``Q_max`` + GUs x actors x largest minibatch x n: ``max_queue_depth_samples`` never exceeds it."""
    minibatches_timed_out: int
    minibatch_errors: int
    actor_deaths: int
    actor_restarts: int
    actors: tuple[ActorObservation, ...]
    """Per actor, as observed at the end of the run (one record type for both read-outs)."""
    mean_duty_cycle: float | None
    max_queue_routing_bytes: int
    """MoE routing replay (R3): the most bytes of routing records the Training Queue held at once."""
    routing_bytes_per_sample: float | None
    """Mean routing bytes of the samples trained on (0 without R3; None if nothing was trained)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (dict keys become strings, as JSON requires)."""
        data = asdict(self)
        data["minibatches_per_gu"] = {str(k): v for k, v in self.minibatches_per_gu.items()}
        data["actors"] = [asdict(a) for a in self.actors]
        return data


def build_summary(seen: LoopObservation) -> RuntimeSummary:
    actors = seen.actors
    cycles = [a.duty_cycle for a in actors if a.duty_cycle is not None]
    return RuntimeSummary(
        prompts_scheduled=seen.prompts_scheduled,
        prompts_consumed=seen.prompts_consumed,
        minibatches_scheduled=seen.minibatches_scheduled,
        minibatches_completed=seen.minibatches_completed,
        duplicate_minibatches_dropped=seen.duplicate_minibatches_dropped,
        superseded_completions_dropped=seen.superseded_completions_dropped,
        minibatches_reissued=seen.minibatches_reissued,
        train_steps=seen.train_steps,
        max_policy_lag_measured=seen.max_policy_lag_measured,
        max_policy_lag_limit=seen.max_policy_lag_limit,
        mean_policy_lag_measured=seen.mean_policy_lag_measured,
        mean_policy_lag_eq4_estimate=seen.mean_policy_lag_eq4_estimate,
        max_queue_depth_samples=seen.max_queue_depth_samples,
        queue_limit_samples=seen.queue_limit_samples,
        queue_resume_samples=seen.queue_resume_samples,
        num_backpressure_pauses=seen.num_backpressure_pauses,
        seconds_paused=seen.seconds_paused,
        starts_refused=dict(seen.starts_refused),
        trainer_lag_holds=seen.trainer_lag_holds,
        reloads_not_newest=seen.reloads_not_newest,
        partial_samples_total=seen.partial_samples_total,
        partial_segments_total=seen.partial_segments_total,
        max_segments_per_sample=seen.max_segments_per_sample,
        minibatches_per_gu=dict(seen.minibatches_per_gu),
        queue_bound_samples=seen.queue_bound_samples,
        minibatches_timed_out=seen.minibatches_timed_out,
        minibatch_errors=seen.minibatch_errors,
        actor_deaths=seen.actor_deaths,
        actor_restarts=seen.actor_restarts,
        actors=actors,
        mean_duty_cycle=sum(cycles) / len(cycles) if cycles else None,
        max_queue_routing_bytes=seen.max_queue_routing_bytes,
        routing_bytes_per_sample=seen.routing_bytes_per_sample,
    )
