"""The fault-test hook is parsed in cli/, and only an async run accepts it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli import fault_hooks
from mindspeed_rl.config_cls import load_config_from_files

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_fault_plan_parses_the_test_hook() -> None:
    plan = fault_hooks.fault_plan({fault_hooks.FAULTS_ENV: "actor:0:1:2,gu:1:3"})
    assert plan.actor_faults == {(0, 1): {2: "exit"}} and plan.gu_dies == {1: 3}
    assert fault_hooks.fault_plan({}).actor_faults == {}
    with pytest.raises(ValueError, match="actor:G:A:N"):
        fault_hooks.fault_plan({fault_hooks.FAULTS_ENV: "actor:0:x"})


def test_hang_and_raise_faults_fire_on_their_minibatch_of_the_slot() -> None:
    env = {fault_hooks.FAULTS_ENV: "hang:0:0:3,raise:0:0:5,raise:1:0:*"}
    plan = fault_hooks.fault_plan(env)
    assert [plan.actor_fault(0, 0, n) for n in range(1, 7)] == [None, None, "hang", None, "raise", None]
    assert {plan.actor_fault(1, 0, n) for n in range(1, 20)} == {"raise"}
    assert plan.actor_fault(0, 1, 3) is None


def test_evaluation_faults_fire_on_their_decode_of_the_slot_only() -> None:
    plan = fault_hooks.fault_plan({fault_hooks.FAULTS_ENV: "eval-exit:0:0:1,eval-hang:0:0:3"})
    assert [plan.eval_fault(0, 0, n) for n in range(1, 5)] == ["exit", None, "hang", None]
    assert plan.actor_faults == {} and plan.actor_fault(0, 0, 1) is None


@pytest.mark.parametrize(
    "item",
    ["hang:0:0:*", "raise:0:0", "raise:0:0:0", "boom:0:0:1", "gu:0:*", "eval-exit:0:0:*", "eval-raise:0:0:1"],
)
def test_malformed_fault_items_are_refused(item: str) -> None:
    with pytest.raises(ValueError, match="hang:G:A:N"):
        fault_hooks.fault_plan({fault_hooks.FAULTS_ENV: item})


def test_no_faults_means_production_inputs() -> None:
    config = load_config_from_files(CONFIGS, "grpo_tiny_asp", [])
    assert fault_hooks.faults_from_env(config, {}) is None
    faults = fault_hooks.faults_from_env(config, {fault_hooks.FAULTS_ENV: "gu:0:1"})
    assert faults is not None and faults.gu_dies == {0: 1}


def test_faults_need_the_async_pipeline() -> None:
    config = load_config_from_files(CONFIGS, "grpo_tiny_cpu", [])
    with pytest.raises(ValueError, match="pipeline=async"):
        fault_hooks.faults_from_env(config, {fault_hooks.FAULTS_ENV: "gu:0:1"})
