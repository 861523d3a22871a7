"""``check_config --cluster`` with memory: the shipped 30 B layout fits its 64 GB NPUs rank by rank,
the same model on one rank does not, and the error names the rank, the term and a key."""

from __future__ import annotations

import json

import pytest

from cli import check_config


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
