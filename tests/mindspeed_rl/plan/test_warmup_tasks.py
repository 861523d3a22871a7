"""Which built-in tasks a warm-up can train on, and which pairs it picks (plan.sections.warmup_spec)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.sections import warmup_spec
from mindspeed_rl.trainer.policy_model import _build_record

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@pytest.mark.parametrize(
    ("config_name", "task"), [("grpo_tiny_asp", "demo"), ("grpo_tiny_tools", "arith_tools")]
)
def test_the_task_follows_the_data_path(config_name: str, task: str) -> None:
    spec = warmup_spec(load_config_from_files(CONFIGS, config_name))
    assert spec is not None and spec.task == task


def test_a_task_without_reference_answers_is_refused_naming_those_with_them() -> None:
    config = load_config_from_files(CONFIGS, "grpo_tiny_cpu", ["megatron_training.data_path=builtin:maze"])
    with pytest.raises(ValueError, match="builtin:arith_tools, builtin:demo, builtin:demo_short"):
        warmup_spec(config)


def test_a_demo_build_record_stays_as_it_was() -> None:
    """Folders built before the task was recorded must not read as "built otherwise"."""
    from mindspeed_rl.plan.build import build_run_plan

    demo = build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_asp"))
    tools = build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_tools"))
    assert "task" not in _build_record(demo.model, demo.warmup)["warmup"]
    assert _build_record(tools.model, tools.warmup)["warmup"]["task"] == "arith_tools"
