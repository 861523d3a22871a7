"""The trainer's device and precision in the run plan: from resources, bf16, generate_config.dtype."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import RunPlan, build_run_plan

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _plan(*overrides: str, name: str = "grpo_tiny_cpu") -> RunPlan:
    return build_run_plan(load_config_from_files(CONFIGS, name, overrides))


def test_device_follows_the_training_units_resources() -> None:
    assert _plan().trainer.engine.device == "cpu"
    assert _plan("rl_config.actor_resource.num_gpus=1").trainer.engine.device == "cuda"
    assert _plan("rl_config.actor_resource.num_npus=8").trainer.engine.device == "npu"
    asp = "grpo_tiny_asp"
    assert _plan("async_config.trainer_resources.num_gpus=1", name=asp).trainer.engine.device == "cuda"
    # The async trainer's own request decides, not the hybrid actor_resource.
    assert _plan("rl_config.actor_resource.num_gpus=1", name=asp).trainer.engine.device == "cpu"
    with pytest.raises(ValueError, match="both GPUs"):
        _plan("rl_config.actor_resource.num_gpus=1", "rl_config.actor_resource.num_npus=1")


def test_bf16_is_honoured_on_cpu_and_no_longer_listed_inert() -> None:
    plain = _plan().trainer.engine
    assert (plain.param_dtype, plain.export_dtype) == ("float32", "float32")
    plan = _plan("megatron_training.bf16=true", "generate_config.dtype=bfloat16")
    assert (plan.trainer.engine.param_dtype, plan.trainer.engine.export_dtype) == ("bfloat16", "bfloat16")
    assert not [k for k in plan.inert_keys if k.key in ("bf16", "fp16")]
    assert _plan("generate_config.dtype=auto").trainer.engine.export_dtype is None
    with pytest.raises(ValueError, match="fp16: true is not implemented"):
        _plan("megatron_training.fp16=true")


def test_shipped_accelerator_configs_plan_bf16_on_npu_without_torch_npu() -> None:
    engine = _plan(name="grpo_qwen3_30b_a3b_asp_A3").trainer.engine
    assert (engine.device, engine.param_dtype, engine.export_dtype) == ("npu", "bfloat16", "bfloat16")


def test_the_offload_switches_reach_only_the_colocated_hybrid() -> None:
    switches = ("generate_config.offload_train_optimizer=true", "generate_config.offload_train_param=true")
    colocated = _plan("rl_config.actor_resource.num_gpus=1", *switches).offload
    assert colocated is not None and (colocated.optimizer, colocated.grad, colocated.param) == (
        True,
        False,
        True,
    )
    assert _plan(*switches).offload is None  # CPU: trainer and rollout are two processes
    assert _plan("async_config.trainer_resources.num_gpus=1", *switches, name="grpo_tiny_asp").offload is None
