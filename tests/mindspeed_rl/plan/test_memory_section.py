"""``check_config --cluster`` with memory: the shipped 30 B layout fits its 64 GB NPUs rank by rank,
the same model on one rank does not, and the error names the rank, the term and a key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli import check_config
from mindspeed_rl.plan.memory_section import colocated_memory


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = check_config.main(list(args))
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else {}, captured.err


def test_the_paper_layout_fits_every_rank_and_actor(capsys: pytest.CaptureFixture[str]) -> None:
    code, placed, _ = _run(capsys, "--config-name", "grpo_qwen3_30b_a3b_asp_A3", "--cluster", "8x8")
    assert code == 0
    memory = placed["memory_gb"]
    assert memory["device_memory_gb"] == 64 and memory["problem"] is None
    assert len(memory["trainer_ranks"]) == 32 and len(memory["generation_actors"]) == 16
    assert all(r["total"] <= 64 for r in memory["trainer_ranks"] + memory["generation_actors"])
    rank = memory["trainer_ranks"][0]
    assert set(rank) == {
        "total",
        "parameters",
        "gradients",
        "optimizer_state",
        "reference",
        "activations",
        "headroom",
    }
    assert rank["total"] == pytest.approx(sum(v for k, v in rank.items() if k != "total"), abs=0.05)


def test_one_rank_for_a_30b_model_exits_naming_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(
        capsys, "--config-name", "grpo_qwen3_30b_a3b_asp_A3", "--cluster", "8x8",
        "actor_config.tensor_model_parallel_size=1", "actor_config.expert_model_parallel_size=1",
    )  # fmt: skip
    assert code == 2
    assert "device memory: trainer rank 0 needs" in err and "largest term: parameters" in err
    assert "tensor_model_parallel_size" in err


def test_a_bigger_device_fits_what_a_smaller_one_does_not(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--config-name", "grpo_qwen3_30b_a3b_asp_A3", "--cluster", "8x8")
    assert _run(capsys, *args, "--device-memory-gb", "40")[0] == 2
    assert _run(capsys, *args, "--device-memory-gb", "141")[0] == 0


def test_moe_at_tp2_on_cpu_is_refused_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(
        capsys, "--config-name", "grpo_tiny_megatron_moe",
        "actor_config.tensor_model_parallel_size=2", "actor_config.expert_model_parallel_size=1",
    )  # fmt: skip
    assert code == 2 and "sequence_parallel" in err


def _plan(name: str, *overrides: str) -> tuple[Any, Any]:
    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.plan.build import build_run_plan

    plan = build_run_plan(load_config_from_files(check_config.REPO_CONFIGS, name, overrides))
    assert plan.memory is not None and plan.offload is not None
    return plan.memory, plan.offload


def test_the_235b_recipe_at_the_old_utilization_is_refused_with_the_key_and_numbers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The issue's case: with 0.85 vLLM leaves (1 - 0.85) x 64 = 9.6 GB, and the trainer keeps
    its reference (``use_integrated_worker: false``) and runtime (every offload_train_* part is on).
    With upstream's integrated worker (the default) the reference is on the host then: it starts."""
    assert (
        _run(
            capsys, "--config-name", "grpo_qwen3_235b_a22b_A3", "generate_config.gpu_memory_utilization=0.85"
        )[0]
        == 0
    )
    old = ("generate_config.gpu_memory_utilization=0.85", "rl_config.use_integrated_worker=false")
    code, _, err = _run(capsys, "--config-name", "grpo_qwen3_235b_a22b_A3", *old)
    assert code == 2
    memory, offload = _plan("grpo_qwen3_235b_a22b_A3", *old)
    start = colocated_memory(memory, offload, 64.0)
    assert start["allowed"] == pytest.approx((1 - 0.85) * 64, abs=0.01)
    assert start["resident_at_engine_start"] > start["allowed"]
    assert "error: device memory: colocated start-up" in err
    assert (
        f"keeps {start['resident_at_engine_start']:.1f} GB" in err and f"the {start['allowed']:.1f} GB" in err
    )
    highest = int((1 - start["resident_at_engine_start"] / 64) * 100) / 100
    assert f"lower generate_config.gpu_memory_utilization to {highest:.2f} or less" in err
    # Applying the fix the message names makes it start.
    code, _, _ = _run(
        capsys,
        "--config-name",
        "grpo_qwen3_235b_a22b_A3",
        f"generate_config.gpu_memory_utilization={highest}",
        "rl_config.use_integrated_worker=false",
    )
    assert code == 0


def test_a_part_left_on_the_device_is_named_with_its_offload_key(capsys: pytest.CaptureFixture[str]) -> None:
    keep = ("generate_config.offload_train_optimizer=false", "generate_config.offload_train_grad=false")
    code, _, err = _run(capsys, "--config-name", "dapo_qwen3_30b_a3b_A3", *keep)
    assert code == 2 and "colocated start-up" in err
    assert "generate_config.offload_train_optimizer: true" in err
    assert "generate_config.offload_train_grad: true" in err
    assert "offload_train_param" not in err  # already on


def test_with_a_cluster_the_start_up_is_in_the_placement(capsys: pytest.CaptureFixture[str]) -> None:
    code, placed, err = _run(capsys, "--config-name", "grpo_qwen3_235b_a22b_A3", "--cluster", "16x16")
    assert code == 0, err
    start = placed["memory_gb"]["colocated_start"]
    assert start["problem"] is None and start["resident_at_engine_start"] <= start["allowed"]
    assert set(start) >= {"reference", "runtime_context", "push_peak", "pipeline_stage"}


SHIPPED = sorted(path.stem for path in check_config.REPO_CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_passes_and_every_colocated_one_prints_its_start_up(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    code, _, err = _run(capsys, "--config-name", name)
    assert code == 0, err
    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.plan.build import build_run_plan

    plan = build_run_plan(load_config_from_files(check_config.REPO_CONFIGS, name, ()))
    if plan.offload is not None and plan.placement.device_kind is not None:
        assert "colocated start-up (" in err and "GB allowed" in err
    else:
        assert "colocated start-up (" not in err
