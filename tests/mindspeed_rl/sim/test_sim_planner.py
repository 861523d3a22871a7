"""The allocation planner's arithmetic against hand-computed cases, and its simulated check."""

from __future__ import annotations

import pytest

from mindspeed_rl.sim.plan_check import verify_plan
from mindspeed_rl.sim.planner import (
    PlannerInputs,
    TrainingUnitOption,
    candidate_plans,
    options_from_pairs,
    recommend,
)


def _paper_inputs(total: int) -> PlannerInputs:
    return PlannerInputs(
        total_devices=total,
        training_options=(TrainingUnitOption(num_devices=8, train_seconds=287.6),),
        actor_devices=2,
        gen_seconds=763.3,
        prompts_per_minibatch=4,
        num_prompts_per_global_batch=16,
        load_seconds=73.9,
        save_seconds=23.5,
        convert_seconds=84.6,
        actors_per_gu=4,
    )


def test_paper_breakdown_gives_eleven_actors_on_32_devices() -> None:
    # r = 4 / (763.3 + 73.9) prompts/s per actor; C = 16 / 287.6; C / r = 11.64 -> 11 actors.
    plan = recommend(_paper_inputs(32))
    r, c = 4 / 837.2, 16 / 287.6
    assert plan.num_actors == 11 and plan.num_generation_units == 3 and plan.idle_devices == 32 - 8 - 22
    assert plan.rollout_to_consumption == pytest.approx(11 * r / c)
    assert plan.iteration_seconds == pytest.approx(16 / (11 * r))  # 304.4 s
    assert plan.bottleneck == "generation" and plan.mild
    assert plan.d_off_eq4 == pytest.approx((23.5 + 84.6 + 73.9 + 763.3) / 287.6)  # the paper's 3.3
    assert plan.duty_cycle == pytest.approx(763.3 / 837.2)  # the paper's 0.912


def test_device_limited_plan_is_a_strong_generation_bottleneck() -> None:
    plan = recommend(_paper_inputs(16))
    assert plan.num_actors == 4 and plan.iteration_seconds == pytest.approx(837.2)
    assert not plan.mild and plan.bottleneck == "generation"


def test_remaining_devices_grow_the_training_unit() -> None:
    inputs = PlannerInputs(
        total_devices=64,
        training_options=options_from_pairs(["8:300", "16:150"]),
        actor_devices=2,
        gen_seconds=100.0,
        prompts_per_minibatch=1,
        num_prompts_per_global_batch=10,
    )
    # r = 0.01/s. TU 8: C = 1/30 -> 3 actors, iteration max(300, 333.3). TU 16: C = 1/15 -> 6 actors,
    # iteration max(150, 166.7). The bigger TU wins.
    first, second = candidate_plans(inputs)
    assert (first.num_actors, second.num_actors) == (3, 6)
    assert first.iteration_seconds == pytest.approx(1000 / 3)
    assert recommend(inputs) == second and second.iteration_seconds == pytest.approx(500 / 3)


def test_exact_balance_and_training_bound_labels() -> None:
    inputs = PlannerInputs(
        total_devices=100,
        training_options=(TrainingUnitOption(num_devices=4, train_seconds=100.0),),
        actor_devices=1,
        gen_seconds=100.0,
        prompts_per_minibatch=1,
        num_prompts_per_global_batch=10,
    )
    plan = recommend(inputs)
    assert plan.num_actors == 10 and plan.bottleneck == "balanced" and plan.iteration_seconds == 100.0
    from mindspeed_rl.sim.planner import plan_for

    over = plan_for(inputs, inputs.training_options[0], 12)
    assert over.bottleneck == "training" and "backpressure" in over.queue_behaviour


def test_invalid_inputs_name_the_fix() -> None:
    with pytest.raises(ValueError, match="add devices"):
        _paper_inputs(9)
    with pytest.raises(ValueError, match="DEVICES:T_TRAIN_SECONDS"):
        options_from_pairs(["8"])


def test_simulated_check_agrees_with_the_prediction() -> None:
    inputs = PlannerInputs(
        total_devices=8,
        training_options=(TrainingUnitOption(num_devices=2, train_seconds=10.0),),
        actor_devices=1,
        gen_seconds=30.0,
        prompts_per_minibatch=2,
        num_prompts_per_global_batch=4,
        load_seconds=2.0,
    )
    plan = recommend(inputs)  # r = 2/32, C = 0.4 -> 6 actors (max 6), iteration 4 / (6/16) = 10.67 s
    assert plan.num_actors == 6 and plan.iteration_seconds == pytest.approx(32 / 3)
    check = verify_plan(plan, inputs, num_iterations=24)
    assert check.simulated_iteration_seconds == pytest.approx(plan.iteration_seconds, rel=0.1)
