"""The fault-test hook is parsed in cli/, and only an async run accepts it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli import fault_hooks
from mindspeed_rl.config_cls import load_config_from_files

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_fault_plan_parses_the_test_hook() -> None:
    plan = fault_hooks.fault_plan({fault_hooks.FAULTS_ENV: "actor:0:1:2,gu:1:3"})
    assert plan.actor_dies == {(0, 1): 2} and plan.gu_dies == {1: 3}
    assert fault_hooks.fault_plan({}).actor_dies == {}
    with pytest.raises(ValueError, match="actor:G:A:N"):
        fault_hooks.fault_plan({fault_hooks.FAULTS_ENV: "actor:0:x"})


def test_no_faults_means_production_inputs(tmp_path: Path) -> None:
    config = load_config_from_files(CONFIGS, "grpo_tiny_asp", [])
    assert fault_hooks.inputs_with_faults(config, tmp_path, {}) is None


def test_faults_need_the_async_pipeline(tmp_path: Path) -> None:
    config = load_config_from_files(CONFIGS, "grpo_tiny_cpu", [])
    with pytest.raises(ValueError, match="pipeline=async"):
        fault_hooks.inputs_with_faults(config, tmp_path, {fault_hooks.FAULTS_ENV: "gu:0:1"})
