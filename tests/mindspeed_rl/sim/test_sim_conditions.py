"""Simulated conditions: the preset's schedule section maps onto ScheduleParams plus tau."""

from __future__ import annotations

import pytest

from asp_scheduler import ScheduleParams
from mindspeed_rl.sim.conditions import build_condition_schedules, schedule_section
from mindspeed_rl.sim.preset import SimPreset
from mindspeed_rl.sim.workload import SyntheticWorkload

PRESET = {
    "profile": {
        "decode": {"per_step_seconds": 0.1, "per_token_seconds": 0.0},
        "train": {"per_step_seconds": 1.0},
        "weight_flow": {"save_seconds": 1.0, "convert_seconds": 1.0, "load_seconds": 1.0},
    },
    "cluster": {"num_generation_units": 1, "actors_per_gu": 1},
    "workload": {"synthetic": {"num_prompts": 24, "num_samples_per_prompt": 1, "median_tokens": 50}},
    "schedule": {
        "b": 4,
        "kappa": 1,
        "k": 3,
        "tau": 0.7,
        "sa_iterations": 500,
        "dp_objective": "padded_slots",
    },
    "runtime": {"num_prompts_per_global_batch": 4},
}


def test_schedule_section_splits_tau_and_rejects_unknown_keys() -> None:
    params, tau = schedule_section({"b": 4, "k": 3, "tau": 0.5})
    assert params == ScheduleParams(b=4, k=3) and tau == 0.5
    with pytest.raises(
        ValueError, match=r"unknown key\(s\) \['temperature'\] in schedule; valid keys: .*'tau'"
    ):
        schedule_section({"b": 4, "temperature": 1.0})
    with pytest.raises(ValueError, match="kappa"):
        schedule_section({"kappa": -2})


def test_preset_schedule_loads_and_overrides_keep_tau_apart() -> None:
    preset = SimPreset.from_mapping(PRESET)
    assert preset.schedule == ScheduleParams(
        b=4, kappa=1, k=3, sa_iterations=500, dp_objective="padded_slots"
    )
    assert preset.tau == 0.7
    changed = preset.with_schedule(tau=0.9, b=6)
    assert (changed.schedule.b, changed.schedule.k, changed.tau) == (6, 3, 0.9)
    with pytest.raises(ValueError, match="unknown key"):
        preset.with_schedule(taus=0.9)


def test_conditions_reject_calibrated_loads() -> None:
    workload = SyntheticWorkload(num_prompts=24, num_samples_per_prompt=1, median_tokens=50).draw(0)
    with pytest.raises(ValueError, match="set calibrate_loads false"):
        build_condition_schedules(workload, ScheduleParams(b=4, k=3, calibrate_loads=True), tau=0.7)
    built = build_condition_schedules(workload, ScheduleParams(b=4, k=3, sa_iterations=100), ["C4"], tau=0.7)
    assert [mb.batch_group_id for mb in built.schedules["C4"]] == [i // 3 for i in range(6)]
