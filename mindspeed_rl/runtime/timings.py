"""Measured durations of the weight flow and of generation, and per-actor duty cycles.

Duty cycle η of an actor, as the paper defines it (App. D.6): generating time ÷ (generating
time + weight-loading time). It isolates what deferred reloads cost an actor. We also report
the wall-clock busy fraction — generating time ÷ time since the actor first started work —
which additionally charges idle waits (backpressure, lag holds, starvation), and is the number
to look at when asking whether generation capacity is wasted.
"""

from __future__ import annotations

from dataclasses import dataclass


class RunningMean:
    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0

    def add(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"durations are non-negative, got {value}; report elapsed seconds.")
        self.count += 1
        self.total += value

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightFlowTimings:
    """Mean durations (seconds) of the terms of Eq. 4."""

    t_save: float
    t_convert: float
    t_load: float
    t_gen: float
    t_train: float


def eq4_d_off_estimate(q_arrival_global_batches: float, timings: WeightFlowTimings) -> float:
    """Eq. 4: ``d_off ≈ Q_arrival + (T_save + T_convert + T_load + T_gen) / T_train``."""
    if timings.t_train <= 0:
        raise ValueError(f"Eq. 4 needs a positive T_train, got {timings.t_train}.")
    t = timings
    return q_arrival_global_batches + (t.t_save + t.t_convert + t.t_load + t.t_gen) / t.t_train


class TimingStats:
    def __init__(self) -> None:
        self.save = RunningMean()
        self.convert = RunningMean()
        self.load = RunningMean()
        self.gen = RunningMean()
        self.train = RunningMean()

    def current(self) -> WeightFlowTimings | None:
        """Means so far; ``None`` until a generation and a train step have been measured.

        A weight-flow term with no measurement yet counts as 0 s: before the first snapshot no
        save, convert or load has happened, so that is its true cost so far.
        """
        if self.gen.mean is None or self.train.mean is None or self.train.mean <= 0:
            return None
        return WeightFlowTimings(
            t_save=self.save.mean or 0.0,
            t_convert=self.convert.mean or 0.0,
            t_load=self.load.mean or 0.0,
            t_gen=self.gen.mean,
            t_train=self.train.mean,
        )


@dataclass(slots=True, kw_only=True)
class ActorActivity:
    first_seen: float
    generating_seconds: float = 0.0
    loading_seconds: float = 0.0
    num_minibatches: int = 0
    num_reloads: int = 0

    @property
    def duty_cycle(self) -> float | None:
        busy = self.generating_seconds + self.loading_seconds
        return self.generating_seconds / busy if busy > 0 else None

    def busy_fraction(self, now: float) -> float | None:
        span = now - self.first_seen
        return self.generating_seconds / span if span > 0 else None


class ActorActivityLog:
    """Generating and loading time per actor, keyed by ``(gu_id, actor_id)``."""

    def __init__(self) -> None:
        self.actors: dict[tuple[int, int], ActorActivity] = {}

    def _get(self, key: tuple[int, int], since: float) -> ActorActivity:
        activity = self.actors.setdefault(key, ActorActivity(first_seen=since))
        activity.first_seen = min(activity.first_seen, since)
        return activity

    def on_generated(self, gu_id: int, actor_id: int, *, started_at: float, finished_at: float) -> None:
        activity = self._get((gu_id, actor_id), started_at)
        activity.generating_seconds += finished_at - started_at
        activity.num_minibatches += 1

    def on_loaded(self, gu_id: int, actor_id: int, *, seconds: float, finished_at: float) -> None:
        activity = self._get((gu_id, actor_id), finished_at - seconds)
        activity.loading_seconds += seconds
        activity.num_reloads += 1
