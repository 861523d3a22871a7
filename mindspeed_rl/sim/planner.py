"""TU/GU allocation planner: the paper's static heuristic (App. B.6) as arithmetic.

Rates, in prompts per second:

* TU consumption ``C = P / T_train`` (``P`` prompts per global batch);
* one actor's rollout ``r = m / (T_gen + T_load)``: ``m`` prompts per minibatch, and a deferred
  reload before every minibatch (true whenever a minibatch outlasts a trainer step, as in the
  paper's runs; it makes the estimate slightly conservative otherwise).

With ``A`` actors, ``ρ = A · r / C``. The heuristic wants generation a *mild* bottleneck: the
largest ``A`` with ``ρ <= 1`` (the Training Queue stays bounded without pause/resume cycles), and
calls it mild when ``ρ >= 1 - margin``. The iteration time is paced by the slower side,
``max(T_train, P / (A · r))``. Step 4 of the heuristic (devices left after balancing → grow the
TU, rebalance) walks the measured TU sizes in increasing order and keeps the fastest plan.

Eq. 4 is reported twice: as the paper writes it (``T_train`` in the denominator) and with the
iteration period instead — when generation is the bottleneck the trainer steps once per
iteration, not once per ``T_train``, and the second form is what a simulation measures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingUnitOption:
    num_devices: int
    train_seconds: float
    """Measured step time of a TU of this size (seconds per global batch)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerInputs:
    total_devices: int
    training_options: tuple[TrainingUnitOption, ...]
    """TU sizes to consider, with their measured step times (at least the minimum TU)."""
    actor_devices: int
    """Devices of one generation actor (the smallest convenient slice, e.g. a TP2 group)."""
    gen_seconds: float
    """Mean time for one actor to generate one minibatch."""
    prompts_per_minibatch: float
    num_prompts_per_global_batch: int
    load_seconds: float = 0.0
    save_seconds: float = 0.0
    convert_seconds: float = 0.0
    margin: float = 0.1
    """Generation counts as a *mild* bottleneck while rollout >= (1 - margin) x consumption."""
    actors_per_gu: int | None = None
    """Actors per GU (e.g. one GU per node); only used to express the plan in GUs."""

    def __post_init__(self) -> None:
        if not self.training_options:
            raise ValueError("give at least one TU option (devices and measured T_train).")
        for opt in self.training_options:
            if opt.num_devices < 1 or not opt.train_seconds > 0:
                raise ValueError(f"TU option {opt} needs num_devices >= 1 and train_seconds > 0.")
        positive = (
            self.actor_devices,
            self.gen_seconds,
            self.prompts_per_minibatch,
            self.num_prompts_per_global_batch,
        )
        if min(positive) <= 0:
            raise ValueError(
                "actor_devices, gen_seconds, prompts_per_minibatch and num_prompts_per_global_batch must be > 0."
            )
        if min(self.load_seconds, self.save_seconds, self.convert_seconds) < 0:
            raise ValueError("load/save/convert seconds must be >= 0.")
        if not 0 <= self.margin < 1:
            raise ValueError(
                f"margin must lie in [0, 1), got {self.margin}; 0.1 means rollout >= 90% of TU rate."
            )
        if self.actors_per_gu is not None and self.actors_per_gu < 1:
            raise ValueError("actors_per_gu must be >= 1 when given.")
        smallest = min(o.num_devices for o in self.training_options)
        if self.total_devices < smallest + self.actor_devices:
            raise ValueError(
                f"{self.total_devices} devices cannot hold the smallest TU ({smallest}) plus one actor "
                f"({self.actor_devices}); add devices or measure a smaller TU."
            )

    @property
    def actor_prompts_per_second(self) -> float:
        return self.prompts_per_minibatch / (self.gen_seconds + self.load_seconds)


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocationPlan:
    training_devices: int
    num_actors: int
    generation_devices: int
    idle_devices: int
    num_generation_units: int | None
    train_seconds: float
    rollout_prompts_per_second: float
    consumption_prompts_per_second: float
    rollout_to_consumption: float
    """ρ = rollout ÷ consumption: < 1 generation-bound, > 1 training-bound."""
    iteration_seconds: float
    bottleneck: str
    queue_behaviour: str
    mild: bool
    """ρ in [1 - margin, 1]: the heuristic's target."""
    d_off_eq4: float
    """Eq. 4 as the paper writes it, at ``Q_arrival = 0``."""
    d_off_at_iteration_period: float
    """Eq. 4 with the iteration period in place of ``T_train``, at ``Q_arrival = 0``."""
    duty_cycle: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_for(inputs: PlannerInputs, option: TrainingUnitOption, num_actors: int) -> AllocationPlan:
    """Predicted behaviour of one TU size with ``num_actors`` actors."""
    if num_actors < 1:
        raise ValueError(f"num_actors must be >= 1, got {num_actors}.")
    used = option.num_devices + num_actors * inputs.actor_devices
    if used > inputs.total_devices:
        raise ValueError(f"{num_actors} actors and a {option.num_devices}-device TU need {used} devices.")
    rollout = num_actors * inputs.actor_prompts_per_second
    consumption = inputs.num_prompts_per_global_batch / option.train_seconds
    rho = rollout / consumption
    iteration = max(option.train_seconds, inputs.num_prompts_per_global_batch / rollout)
    if math.isclose(rho, 1.0, rel_tol=1e-9):
        bottleneck, queue = (
            "balanced",
            "bounded: arrivals match consumption (fluctuations absorbed by the queue)",
        )
    elif rho < 1:
        bottleneck, queue = "generation", "bounded: stays near empty, the trainer waits for rollouts"
    else:
        bottleneck, queue = (
            "training",
            "grows until backpressure (Q_max) pauses generation; pause/resume cycles",
        )
    delay = inputs.save_seconds + inputs.convert_seconds + inputs.load_seconds + inputs.gen_seconds
    return AllocationPlan(
        training_devices=option.num_devices,
        num_actors=num_actors,
        generation_devices=num_actors * inputs.actor_devices,
        idle_devices=inputs.total_devices - used,
        num_generation_units=None
        if inputs.actors_per_gu is None
        else math.ceil(num_actors / inputs.actors_per_gu),
        train_seconds=option.train_seconds,
        rollout_prompts_per_second=rollout,
        consumption_prompts_per_second=consumption,
        rollout_to_consumption=rho,
        iteration_seconds=iteration,
        bottleneck=bottleneck,
        queue_behaviour=queue,
        mild=1 - inputs.margin <= rho <= 1 + 1e-9,
        d_off_eq4=delay / option.train_seconds,
        d_off_at_iteration_period=delay / iteration,
        duty_cycle=inputs.gen_seconds / (inputs.gen_seconds + inputs.load_seconds),
    )


def candidate_plans(inputs: PlannerInputs) -> list[AllocationPlan]:
    """One plan per TU size that fits: the most actors keeping rollout at or below consumption."""
    plans = []
    for option in sorted(inputs.training_options, key=lambda o: o.num_devices):
        free = inputs.total_devices - option.num_devices
        max_actors = free // inputs.actor_devices
        if max_actors < 1:
            break
        consumption = inputs.num_prompts_per_global_batch / option.train_seconds
        # Largest A with A * r <= C; the tolerance keeps an exact balance from rounding down.
        balanced = math.floor(consumption / inputs.actor_prompts_per_second + 1e-9)
        plans.append(plan_for(inputs, option, max(1, min(balanced, max_actors))))
        if balanced > max_actors:
            break  # generation already starves this TU; a bigger TU would only starve more
    return plans


def recommend(inputs: PlannerInputs) -> AllocationPlan:
    """The fastest candidate; ties go to the plan that uses fewer devices."""
    plans = candidate_plans(inputs)
    assert plans, "PlannerInputs guarantees the smallest TU plus one actor fits"
    return min(
        plans, key=lambda p: (round(p.iteration_seconds, 6), p.training_devices + p.generation_devices)
    )


def format_plan(plan: AllocationPlan, inputs: PlannerInputs) -> str:
    gus = (
        ""
        if plan.num_generation_units is None
        else f" in {plan.num_generation_units} GU(s) of up to {inputs.actors_per_gu}"
    )
    mild = "yes" if plan.mild else f"no (target ratio in [{1 - inputs.margin:.2f}, 1])"
    return "\n".join(
        [
            f"TU: {plan.training_devices} devices (T_train {plan.train_seconds:.1f}s); generation: "
            f"{plan.num_actors} actors x {inputs.actor_devices} devices{gus}; idle devices {plan.idle_devices}",
            f"rollout {plan.rollout_prompts_per_second:.4f} prompts/s vs TU {plan.consumption_prompts_per_second:.4f}"
            f" prompts/s -> ratio {plan.rollout_to_consumption:.3f}, bottleneck: {plan.bottleneck}, mild: {mild}",
            f"predicted iteration time {plan.iteration_seconds:.1f}s; queue: {plan.queue_behaviour}",
            f"d_off (Eq. 4, Q_arrival=0) {plan.d_off_eq4:.2f}; with the iteration period "
            f"{plan.d_off_at_iteration_period:.2f}; duty cycle {plan.duty_cycle:.3f}",
        ]
    )


def options_from_pairs(pairs: Sequence[str]) -> tuple[TrainingUnitOption, ...]:
    """Parse ``DEVICES:SECONDS`` strings (the CLI's ``--tu`` values)."""
    options = []
    for text in pairs:
        devices, sep, seconds = text.partition(":")
        if not sep:
            raise ValueError(f"TU option {text!r} must look like DEVICES:T_TRAIN_SECONDS, e.g. 8:287.6.")
        options.append(TrainingUnitOption(num_devices=int(devices), train_seconds=float(seconds)))
    return tuple(options)
