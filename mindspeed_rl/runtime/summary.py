"""The end-of-run numbers of the control plane (the runtime's part of ``summary.json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from mindspeed_rl.runtime.ingestor import IngestOutcome

if TYPE_CHECKING:
    from mindspeed_rl.runtime.controller import ControlLoop


@dataclass(frozen=True, slots=True, kw_only=True)
class ActorSummary:
    gu_id: int
    actor_id: int
    num_minibatches: int
    num_reloads: int
    generating_seconds: float
    loading_seconds: float
    duty_cycle: float | None
    """η = generating ÷ (generating + loading), the paper's definition (App. D.6)."""
    busy_fraction: float | None
    """generating ÷ wall time since the actor's first work; also charges idle waits."""


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
    """Reloads that did not pick the newest published snapshot (should stay 0)."""
    minibatches_per_gu: dict[int, int]
    actors: tuple[ActorSummary, ...]
    mean_duty_cycle: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (dict keys become strings, as JSON requires)."""
        data = asdict(self)
        data["minibatches_per_gu"] = {str(k): v for k, v in self.minibatches_per_gu.items()}
        data["actors"] = [asdict(a) for a in self.actors]
        return data


def build_summary(loop: ControlLoop) -> RuntimeSummary:
    db, now = loop.database, loop.clock.now()
    actors = tuple(
        ActorSummary(
            gu_id=gu_id,
            actor_id=actor_id,
            num_minibatches=a.num_minibatches,
            num_reloads=a.num_reloads,
            generating_seconds=a.generating_seconds,
            loading_seconds=a.loading_seconds,
            duty_cycle=a.duty_cycle,
            busy_fraction=a.busy_fraction(now),
        )
        for (gu_id, actor_id), a in sorted(loop.activity.actors.items())
    )
    cycles = [a.duty_cycle for a in actors if a.duty_cycle is not None]
    outcomes = loop.ingestor.outcomes
    return RuntimeSummary(
        prompts_scheduled=db.num_prompts,
        prompts_consumed=loop.prompts_consumed,
        minibatches_scheduled=db.num_minibatches,
        minibatches_completed=db.num_completed,
        duplicate_minibatches_dropped=outcomes[IngestOutcome.DUPLICATE],
        superseded_completions_dropped=outcomes[IngestOutcome.SUPERSEDED],
        minibatches_reissued=db.num_reissued,
        train_steps=loop.budget.next_step,
        max_policy_lag_measured=loop.lag.max_d_off,
        max_policy_lag_limit=loop.config.max_policy_lag,
        mean_policy_lag_measured=loop.lag.mean_d_off,
        mean_policy_lag_eq4_estimate=loop.lag.mean_estimate,
        max_queue_depth_samples=loop.queue.max_depth_samples,
        queue_limit_samples=loop.config.queue_max_samples,
        queue_resume_samples=loop.config.queue_resume_samples,
        num_backpressure_pauses=loop.backpressure.num_pauses,
        seconds_paused=loop.backpressure.seconds_paused,
        starts_refused=dict(loop.starts_refused),
        trainer_lag_holds=loop.trainer_lag_holds,
        reloads_not_newest=loop.weights.reloads_not_newest,
        minibatches_per_gu=dict(loop.sender.num_assigned),
        actors=actors,
        mean_duty_cycle=sum(cycles) / len(cycles) if cycles else None,
    )
