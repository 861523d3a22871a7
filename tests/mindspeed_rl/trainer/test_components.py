"""How the trainers read the config: global batches of prompts over several passes of the data."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.trainer import components

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


# 4 prompts x 8 samples per iteration; every micro-batch setting divides that.
SMALL_BATCH = (
    "megatron_training.global_batch_size=4",
    "rl_config.mini_batch_size=4",
    "rl_config.actor_forward_micro_batch_size=8",
    "rl_config.ref_forward_micro_batch_size=8",
    "actor_config.micro_batch_size=8",
)


def _config(*overrides: str):
    return load_config_from_files(CONFIGS, "grpo_tiny_cpu", overrides)


def test_global_batches_cover_every_prompt_once_per_pass() -> None:
    config = _config(
        *SMALL_BATCH,
        "megatron_training.train_iters=5",
    )
    ids = [f"p{i}" for i in range(10)]
    batches = components.global_batches(config, ids)
    assert len(batches) == 5 and all(len(b) == 4 for b in batches)
    # 20 slots over 10 prompts: exactly two full passes, no prompt twice in one batch.
    assert Counter(pid for b in batches for pid in b) == {pid: 2 for pid in ids}
    assert all(len(set(b)) == len(b) for b in batches)


def test_global_batches_no_shuffle_keeps_dataset_order() -> None:
    config = _config(
        *SMALL_BATCH,
        "megatron_training.train_iters=2",
        "megatron_training.no_shuffle=true",
    )
    assert components.global_batches(config, [f"p{i}" for i in range(8)]) == [
        ("p0", "p1", "p2", "p3"),
        ("p4", "p5", "p6", "p7"),
    ]


def test_global_batches_straddling_two_passes_never_repeat_a_prompt() -> None:
    config = _config(
        *SMALL_BATCH,
        "megatron_training.train_iters=30",
    )
    batches = components.global_batches(config, [f"p{i}" for i in range(6)])
    assert all(len(set(b)) == 4 for b in batches)


def test_too_few_prompts_is_a_clear_error() -> None:
    config = _config(*SMALL_BATCH)
    with pytest.raises(ValueError, match="global_batch_size"):
        components.global_batches(config, ["a", "b"])


def test_engine_config_keeps_upstream_units() -> None:
    config = _config("megatron_training.global_batch_size=16", "rl_config.mini_batch_size=8")
    engine = build_run_plan(config).trainer.engine
    assert engine.mini_batch_size == 8  # prompts
    assert engine.samples_per_mini_batch == 8 * config.rl_config.n_samples_per_prompt
    assert engine.micro_batch_size == config.actor_config.training.micro_batch_size  # samples


def test_missing_model_folder_without_build_flag_names_the_fix(tmp_path: Path) -> None:
    config = _config(
        f"megatron_training.tokenizer_name_or_path={tmp_path / 'absent'}",
        "rl_config.build_model_if_missing=false",
    )
    with pytest.raises(ValueError, match="build_model_if_missing"):
        components.prepare_policy_model(config)
