"""Upstream's batch semantics, as its own integrated system tests use them (the configs under
``config_cls/upstream_shipped/st``): a mini-batch larger than the iteration is one optimizer step;
DAPO trains an iteration on every ``filter_groups_train_batch_size`` kept prompts drawn from
generation batches of ``global_batch_size``, in both pipelines."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_rl.config_cls import ConfigError, load_config_from_files
from mindspeed_rl.config_cls.notes import batch_notes
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.plan.sections import lr_schedule, optimizer_steps_per_iteration
from mindspeed_rl.trainer import checkpointing as ckpt

ST = Path(__file__).resolve().parents[1] / "config_cls" / "upstream_shipped" / "st"
GRPO, DAPO = "test_grpo_trainer_qwen25_7b_integrated", "test_dapo_trainer_qwen25_7b_integrated"


def test_a_mini_batch_larger_than_the_iteration_is_one_optimizer_step() -> None:
    config = load_config_from_files(ST, GRPO)  # global_batch_size 4, mini_batch_size 64, n 8
    assert config.num_prompts_per_step == 4 and config.mini_batch_prompts == 4
    assert optimizer_steps_per_iteration(config) == 1
    plan = build_run_plan(config)
    assert plan.trainer.engine.mini_batch_size == 4 and plan.trainer.engine.samples_per_mini_batch == 32
    assert plan.trainer.old_log_probs == "current"  # one step: the ratio is exactly 1, as upstream skips it
    (note,) = batch_notes(config)
    assert "mini_batch_size 64 prompts is more than the 4 prompts one iteration trains" in note
    assert "one optimizer step on its 4 prompts x n_samples_per_prompt 8 samples" in note


@pytest.mark.parametrize("pipeline", ["hybrid", "async"])
def test_dapo_iterations_train_two_kept_prompts_from_generation_batches_of_eight(pipeline: str) -> None:
    # Async: ASP minibatches must fit the lag bound of 2-prompt steps (limit (4 - 0) x 2 + 1 prompts).
    asp = (
        ["asp_config.b=8", "asp_config.kappa=1", "async_config.trainer_resources.num_npus=4",
         "async_config.actor_resources.num_npus=1"]
        if pipeline == "async"
        else []
    )  # fmt: skip
    config = load_config_from_files(ST, DAPO, [f"rl_config.pipeline={pipeline}", *asp])
    assert config.num_prompts_per_global_batch == 8 and config.num_prompts_per_step == 2
    assert config.mini_batch_prompts == 2 and optimizer_steps_per_iteration(config) == 1
    plan = build_run_plan(config)
    sampling = plan.dynamic_sampling
    assert sampling is not None
    assert (sampling.train_batch_prompts, sampling.generation_batch_prompts) == (2, 8)
    assert plan.data.num_prompts_per_step == 2 and plan.data.generation_batches == 1
    # Several iterations may train one generation batch: the behaviour policy is the rollout's.
    assert plan.trainer.old_log_probs == "rollout"
    if pipeline == "async":
        assert plan.runtime is not None and plan.runtime.num_prompts_per_global_batch == 2
    notes = batch_notes(config)
    assert any(
        "trains one iteration on every filter_groups_train_batch_size 2 kept prompts" in n for n in notes
    )
    fingerprint = ckpt.run_fingerprint(plan)
    assert fingerprint["filter_groups_train_batch_size"] == 2 and fingerprint["global_batch_size"] == 8


def test_generation_batches_cover_the_iterations() -> None:
    config = load_config_from_files(
        ST, DAPO, ["megatron_training.train_iters=9", "actor_config.lr_decay_style=linear"]
    )
    # 9 iterations x 2 kept prompts = 18 prompts = 3 generation batches of 8 when nothing is filtered.
    assert build_run_plan(config).data.generation_batches == 3
    assert lr_schedule(config).decay_steps == 9  # one optimizer step per iteration


def test_a_plain_run_keeps_its_fingerprint_keys() -> None:
    # Checkpoints written before filter_groups_train_batch_size existed in the fingerprint still match.
    plan = build_run_plan(load_config_from_files(ST, GRPO))
    assert "filter_groups_train_batch_size" not in ckpt.run_fingerprint(plan)


@pytest.mark.parametrize(
    ("override", "phrase"),
    [
        (
            "rl_config.mini_batch_size=3",
            "rl_config.mini_batch_size: 3 prompts per optimizer step must divide "
            "megatron_training.global_batch_size = 4 prompts per iteration",
        ),
        (
            "rl_config.actor_forward_micro_batch_size=3",
            "rl_config.actor_forward_micro_batch_size: 3 samples must divide one global batch",
        ),
    ],
)
def test_what_still_does_not_split_is_named(override: str, phrase: str) -> None:
    with pytest.raises(ConfigError, match=phrase):
        load_config_from_files(ST, GRPO, [override])


def test_dapo_train_batch_rules_name_its_key() -> None:
    with pytest.raises(ConfigError, match="must divide rl_config.filter_groups_train_batch_size = 4 prompts"):
        load_config_from_files(
            ST, DAPO, ["rl_config.filter_groups_train_batch_size=4", "rl_config.mini_batch_size=3"]
        )
