"""Read-outs of a :class:`~mindspeed_rl.runtime.controller.ControlLoop` that gather from all its
parts: the :class:`LoopObservation` outsiders report, and the :class:`StallView` a stall diagnosis
reads. They only read; the loop calls them under its lock, so each is one consistent snapshot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mindspeed_rl.runtime.database import MinibatchState
from mindspeed_rl.runtime.faults import FaultKind, RunningMinibatch, StallView
from mindspeed_rl.runtime.ingestor import IngestOutcome
from mindspeed_rl.runtime.observation import ActorObservation, LoopObservation

if TYPE_CHECKING:
    from mindspeed_rl.runtime.controller import ControlLoop


def observe(loop: ControlLoop, *, arrivals_since: int, lag_steps_since: int) -> LoopObservation:
    """Every number outsiders report; the arrival and lag logs from the given offsets."""
    db, now, outcomes = loop.database, loop.clock.now(), loop.ingestor.outcomes
    return LoopObservation(
        time=now,
        prompts_scheduled=db.num_prompts,
        prompts_consumed=loop.prompts_consumed,
        minibatches_scheduled=db.num_minibatches,
        minibatches_completed=db.num_completed,
        minibatches_reissued=db.num_reissued,
        duplicate_minibatches_dropped=outcomes[IngestOutcome.DUPLICATE],
        superseded_completions_dropped=outcomes[IngestOutcome.SUPERSEDED],
        minibatches_per_gu=dict(loop.sender.num_assigned),
        train_steps=loop.budget.next_step,
        max_policy_lag_limit=loop.config.max_policy_lag,
        max_policy_lag_measured=loop.lag.max_d_off,
        mean_policy_lag_measured=loop.lag.mean_d_off,
        mean_policy_lag_eq4_estimate=loop.lag.mean_estimate,
        num_lag_steps=len(loop.lag.steps),
        lag_steps=tuple(loop.lag.steps.since(lag_steps_since)),
        trainer_lag_holds=loop.trainer_lag_holds,
        starts_refused=dict(loop.starts_refused),
        queue_depth_samples=loop.queue.depth_samples,
        max_queue_depth_samples=loop.queue.max_depth_samples,
        queue_limit_samples=loop.config.queue_max_samples,
        queue_resume_samples=loop.config.queue_resume_samples,
        num_arrivals=len(loop.queue.arrivals),
        arrivals=tuple(loop.queue.arrivals.since(arrivals_since)),
        paused=loop.backpressure.paused,
        num_backpressure_pauses=loop.backpressure.num_pauses,
        seconds_paused=loop.backpressure.seconds_paused,
        latest_version=loop.latest_version,
        reloads_not_newest=loop.weights.reloads_not_newest,
        partial_samples_total=loop.lag.partial_samples_total,
        partial_segments_total=loop.lag.partial_segments_total,
        max_segments_per_sample=loop.lag.max_segments_per_sample,
        timings=loop.timings.current(),
        mean_train_seconds=loop.timings.train.mean,
        actors=tuple(
            ActorObservation(
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
        ),
        queue_bound_samples=loop.queue_bound_samples,
        minibatches_timed_out=loop.faults.by_kind[FaultKind.TIMEOUT],
        minibatch_errors=loop.faults.by_kind[FaultKind.ERROR],
        actor_deaths=loop.faults.by_kind[FaultKind.DIED],
        actor_restarts=loop.recovery.actor_restarts,
        queue_routing_bytes=loop.queue.routing_bytes,
        max_queue_routing_bytes=loop.queue.max_routing_bytes,
        routing_bytes_per_sample=(
            loop.queue.routing_bytes_taken / loop.queue.samples_taken if loop.queue.samples_taken else None
        ),
    )


def stall_view(loop: ControlLoop, now: float) -> StallView:
    """What ``diagnose_stall`` needs to say where a stalled pipeline is stuck."""
    items = loop.database.in_flight_items()
    running = [
        RunningMinibatch(minibatch_id=i, gu_id=r.gu_id, actor_id=r.actor_id, started_at=r.started_at)
        for i, r in items
        if r.actor_id is not None and r.started_at is not None
    ]
    num_unsent = sum(
        loop.database.state(i) in (MinibatchState.PENDING, MinibatchState.REQUEUED)
        for i in loop.database.minibatch_ids()
    )
    return StallView(
        idle_seconds=now - loop.last_progress,
        live_gus=loop.sender.gu_ids,
        running=running,
        num_issued_not_started=len(items) - len(running),
        num_unsent=num_unsent,
        paused=loop.backpressure.paused,
        queue_depth_samples=loop.queue.depth_samples,
        latest_version=loop.latest_version,
        next_step=loop.budget.next_step,
        last_refusal=dict(loop.last_refusal),
        now=now,
    )


def check_invariants(loop: ControlLoop) -> None:
    """Cross-check the loop's parts (tests and debug runs): states against structures, the
    running minibatches against the actor map, and no prompt lost between ingest and trainer."""
    db = loop.database
    db.check_invariants()
    running = {i for i, rec in db.in_flight_items() if rec.actor_id is not None}
    assert running == set(loop.recovery.running_on.values()), "running minibatches disagree with actor map"
    completed_prompts = sum(
        db.minibatch(i).num_prompts for i in db.minibatch_ids() if db.state(i) is MinibatchState.COMPLETED
    )
    assert completed_prompts == loop.queue.depth_prompts + loop.prompts_consumed, (
        "prompts lost between ingest and trainer"
    )
