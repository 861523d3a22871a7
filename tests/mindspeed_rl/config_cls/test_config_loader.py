"""load_config: merge precedence, units validation, inert keys, no mutation, shipped configs."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from mindspeed_rl.config_cls import ConfigError, load_config, load_config_from_files
from mindspeed_rl.runtime.config import ControlKnobs

REPO_CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _raw(**sections: dict[str, Any]) -> dict[str, Any]:
    """A small valid config (plain containers, as Hydra composes them); sections are merged in."""
    raw: dict[str, Any] = {
        "model": {"toy": {"num_layers": 2, "hidden_size": 32, "lr": 0.5, "micro_batch_size": 1}},
        "megatron_training": {
            "model": "toy",
            "tokenizer_name_or_path": "./toy_model",
            "data_path": "builtin:demo",
            "global_batch_size": 4,
            "train_iters": 3,
            "lr": 0.25,
            "micro_batch_size": 2,
        },
        "actor_config": {"lr": 0.125},
        "rl_config": {"n_samples_per_prompt": 4, "verifier_function": ["demo"], "verifier_weight": [1.0]},
        "generate_config": {"max_model_len": 512, "sampling_config": {"max_tokens": 64}},
    }
    raw["rl_config"]["max_prompt_length"] = 64
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return raw


def _error(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(raw)
    return str(info.value)


def test_merge_precedence_architecture_then_megatron_training_then_role() -> None:
    config = load_config(_raw(ref_config={"micro_batch_size": 8}))
    # lr: model 0.5 < megatron_training 0.25 < actor_config 0.125
    assert config.actor_config.optimizer.lr == 0.125
    assert config.megatron_training.optimizer.lr == 0.25
    assert config.ref_config.optimizer.lr == 0.25  # ref_config does not set lr
    assert config.ref_config.training.micro_batch_size == 8
    assert config.actor_config.training.micro_batch_size == 2  # megatron_training beats the model file
    assert config.model.num_layers == 2 and config.model_name == "toy"
    assert config.reward_config is None and config.critic_config is None


def test_defaults_keep_upstream_yaml_on_the_hybrid_vllm_path() -> None:
    config = load_config(_raw())
    assert config.rl_config.pipeline == "hybrid"
    assert config.rl_config.rollout_backend == "vllm"
    assert config.run_dir == "runs"
    assert config.global_batch_samples == 16 and config.mini_batch_prompts == 4


def test_unknown_keys_in_every_kind_of_section_name_the_nearest_key() -> None:
    message = _error(
        _raw(
            actor_config={"micro_batch_sise": 1},
            rl_config={"n_sample_per_prompt": 2},
            generate_config={"sampling_config": {"temprature": 1.0}},
            asp_config={"kapa": 1},
        )
        | {"asynk_config": {}}
    )
    assert "actor_config: unknown key 'micro_batch_sise'; did you mean 'micro_batch_size'?" in message
    assert "rl_config: unknown key 'n_sample_per_prompt'; did you mean 'n_samples_per_prompt'?" in message
    assert "generate_config.sampling_config: unknown key 'temprature'; did you mean 'temperature'?" in message
    assert "asp_config: unknown key 'kapa'; did you mean 'kappa'?" in message
    assert "config: unknown key 'asynk_config'; did you mean 'async_config'?" in message


def test_type_error_names_the_section_the_value_came_from() -> None:
    assert "actor_config.lr: expected a number, got str 'fast'" in _error(_raw(actor_config={"lr": "fast"}))
    assert "model.toy.num_layers: expected an integer" in _error(_raw(model={"toy": {"num_layers": "two"}}))


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        (
            {"rl_config": {"mini_batch_size": 3}},
            "rl_config.mini_batch_size: 3 prompts per optimizer step must divide "
            "megatron_training.global_batch_size = 4 prompts per iteration",
        ),
        (
            {"actor_config": {"micro_batch_size": 3}},
            "actor_config.micro_batch_size: 3 samples must divide one mini-batch = mini_batch_size 4 prompts "
            "x n_samples_per_prompt 4 = 16 samples",
        ),
        (
            {"rl_config": {"ref_forward_micro_batch_size": 5}},
            "rl_config.ref_forward_micro_batch_size: 5 samples must divide one global batch = "
            "global_batch_size 4 prompts x n_samples_per_prompt 4 = 16 samples",
        ),
        ({"rl_config": {"n_samples_per_prompt": 1}}, "group_norm needs >= 2 responses per prompt"),
        ({"rl_config": {"verifier_weight": [1.0, 2.0]}}, "2 weights for 1 verifier_function entries"),
        ({"generate_config": {"max_model_len": 100}}, "raise it to at least 128"),
        ({"generate_config": {"infer_pipeline_parallel_size": 2}}, "must be 1"),
        ({"megatron_training": {"tokenizer_name_or_path": None}}, "tokenizer_name_or_path: required"),
        ({"asp_config": {"predictor": {"type": "file"}}}, "asp_config.predictor.path: required"),
    ],
)
def test_cross_field_rules_state_units_and_fix(sections: dict[str, Any], expected: str) -> None:
    assert expected in _error(_raw(**sections))


def test_mini_batches_smaller_than_the_global_batch_are_valid() -> None:
    config = load_config(_raw(rl_config={"mini_batch_size": 2}, actor_config={"micro_batch_size": 8}))
    assert config.mini_batch_prompts == 2


def test_async_queue_limits_are_checked_against_one_global_batch_only_in_async_mode() -> None:
    small_queue = {"queue_max_samples": 8, "queue_resume_samples": 4}
    load_config(_raw(async_config=small_queue))  # hybrid: async_config is not read
    message = _error(_raw(async_config=small_queue, rl_config={"pipeline": "async"}))
    assert "async_config: queue_max_samples=8 is smaller than one global batch (16 samples)" in message
    assert "raise queue_max_samples to >= 16" in message


def _async_raw(**async_config: Any) -> dict[str, Any]:
    """``_raw`` on the async pipeline, with queues and minibatches that fit its 16-sample batch."""
    queue = {"queue_max_samples": 64, "queue_resume_samples": 32}
    return _raw(
        rl_config={"pipeline": "async"}, asp_config={"b": 4, "kappa": 0}, async_config=queue | async_config
    )


def test_inherited_async_knobs_parse_typed_and_typos_name_the_nearest_key() -> None:
    config = load_config(_async_raw(gu_queue_high=7, max_policy_lag=None, stall_timeout_s=60))
    a = config.async_config
    assert (a.gu_queue_high, a.max_policy_lag, a.stall_timeout_s) == (7, None, 60.0)
    assert isinstance(a.stall_timeout_s, float)
    message = _error(_async_raw(gu_queu_high=3, max_policy_lag="x"))
    assert "async_config: unknown key 'gu_queu_high'; did you mean 'gu_queue_high'?" in message
    assert "async_config.max_policy_lag: expected an integer, got str 'x'" in message


def test_every_async_knob_reaches_the_control_unit_unchanged() -> None:
    knobs: dict[str, Any] = {
        "gu_queue_low": 2, "gu_queue_high": 6, "queue_max_samples": 96, "queue_resume_samples": 40,
        "snapshot_interval": 2, "max_policy_lag": 3, "minibatch_timeout_s": 30.0,
        "minibatch_timeout_factor": 5.0, "minibatch_timeout_floor_s": 20.0, "minibatch_timeout_warmup_s": 90.0,
        "actor_max_restarts": 1, "minibatch_max_attempts": 2, "stall_timeout_s": 120.0,
    }  # fmt: skip
    assert set(knobs) == {f.name for f in dataclasses.fields(ControlKnobs)}, "set every knob here"
    runtime = load_config(_async_raw(**knobs)).runtime_config()
    assert {k: getattr(runtime, k) for k in knobs} == knobs
    assert (runtime.num_prompts_per_global_batch, runtime.num_samples_per_prompt) == (4, 4)


@pytest.mark.parametrize(
    ("async_config", "asp_config", "expected"),
    [
        (
            {"actor_tensor_parallel_size": 0},
            {},
            "async_config.actor_tensor_parallel_size: must be >= 1, got 0",
        ),
        ({"snapshot_keep": 1}, {}, "async_config.snapshot_keep: must be >= 2"),
        ({"gu_queue_low": 4, "gu_queue_high": 4}, {}, "async_config: need 0 <= gu_queue_low < gu_queue_high"),
        ({"stall_timeout_s": 5.0, "minibatch_timeout_s": 10.0}, {}, "stall_timeout_s=5 must exceed"),
        # b + kappa = 34 prompts > (max_policy_lag 4) x 4 prompts per batch + 1: it could deadlock.
        ({}, {"b": 32, "kappa": 2}, "async_config.max_policy_lag: a minibatch of 34 prompts cannot always"),
    ],
)
def test_async_rules_are_checked_at_load(
    async_config: dict[str, Any], asp_config: dict[str, Any], expected: str
) -> None:
    raw = _async_raw(**async_config)
    raw["asp_config"] |= asp_config
    assert expected in _error(raw)


def test_a_bad_batch_is_reported_once_under_its_own_key() -> None:
    message = _error(
        _async_raw() | {"megatron_training": _raw()["megatron_training"] | {"global_batch_size": 0}}
    )
    assert "megatron_training.global_batch_size: must be >= 1 prompt" in message
    assert "(1 problem(s))" in message


def test_build_model_if_missing_needs_a_complete_architecture() -> None:
    message = _error(_raw(rl_config={"build_model_if_missing": True}))
    assert "model.toy.ffn_hidden_size: required (> 0) to build a model" in message
    assert "model.toy.padded_vocab_size: required" in message


def test_model_selection_errors_explain_the_defaults_form() -> None:
    message = _error(_raw(megatron_training={"model": "other"}))
    assert "'other' is not in the model group (composed: toy); add `- model: [other]` to defaults" in message
    assert "name different models" in _error(_raw(actor_config={"model": "other"}))


def test_inert_keys_are_listed_with_their_section_and_reason() -> None:
    config = load_config(
        _raw(
            megatron_training={"use_flash_attn": True, "sequence_parallel": True},
            actor_config={"tensor_model_parallel_size": 2},
            generate_config={"offload_train_param": True},
            asp_config={"b": 4},
        )
    )
    listed = {(k.section, k.key) for k in config.inert_keys}
    assert listed == {
        ("megatron_training", "use_flash_attn"),
        ("megatron_training", "sequence_parallel"),
        ("actor_config", "tensor_model_parallel_size"),
        ("generate_config", "offload_train_param"),
        ("asp_config", "*"),
    }
    reasons = {k.key: k.reason for k in config.inert_keys}
    assert "torch backend" in reasons["use_flash_attn"] and "async" in reasons["*"]
    assert load_config(_raw()).inert_keys == ()


def test_megatron_layout_keys_are_inert_only_on_the_torch_engine() -> None:
    layout = {"tensor_model_parallel_size": 2}
    torch = load_config(_raw(actor_config=layout, ref_config=layout))
    reasons = {(k.section, k.key): k.reason for k in torch.inert_keys}
    assert "torch backend" in reasons["actor_config", "tensor_model_parallel_size"]
    assert ("ref_config", "tensor_model_parallel_size") in reasons
    on_megatron = {"use_mcore_models": True, "use_flash_attn": True, "no_masked_softmax_fusion": True}
    megatron = load_config(_raw(megatron_training=on_megatron, actor_config=layout, ref_config=layout))
    reasons = {(k.section, k.key): k.reason for k in megatron.inert_keys}
    assert ("actor_config", "tensor_model_parallel_size") not in reasons  # the engine's layout
    assert ("megatron_training", "use_mcore_models") not in reasons  # it chose the engine
    assert "actor_config's" in reasons["ref_config", "tensor_model_parallel_size"]  # roles share it
    assert ("megatron_training", "use_flash_attn") not in reasons  # the megatron engine's attention
    assert ("megatron_training", "no_masked_softmax_fusion") in reasons  # inert on both engines


def test_validation_never_mutates_the_users_config() -> None:
    raw = _raw(megatron_training={"use_flash_attn": True})
    snapshot = copy.deepcopy(raw)
    load_config(raw)
    assert raw == snapshot
    cfg = OmegaConf.create(_raw(actor_config={"lr": "${megatron_training.lr}"}))
    before = OmegaConf.to_yaml(cfg)
    config = load_config(cfg)
    assert OmegaConf.to_yaml(cfg) == before  # interpolation still unresolved in the user's object
    assert config.actor_config.optimizer.lr == 0.25


def test_to_dict_is_json_and_loads_back_to_an_equal_config() -> None:
    config = load_config(_raw(rl_config={"actor_resource": {"num_cpus": 0.5}}, profiler_config={}))
    as_json = json.loads(json.dumps(config.to_dict()))
    assert as_json["actor_config"]["lr"] == 0.125 and as_json["model"] == {"toy": as_json["model"]["toy"]}
    assert load_config(as_json) == config


def test_raw_yaml_with_a_defaults_list_is_refused_with_the_fix() -> None:
    assert "use load_config_from_files" in _error(_raw() | {"defaults": [{"model": ["toy"]}]})


def _run_configs() -> list[str]:
    return sorted(p.stem for p in REPO_CONFIGS.glob("*.yaml"))


def test_the_repository_ships_the_expected_run_configs() -> None:
    expected = {
        "grpo_tiny_cpu",
        "grpo_tiny_asp",
        "grpo_qwen3_30b_a3b_asp_A3",
        "grpo_qwen3_32b_asp_A3",
        "grpo_qwen25_7b_A3",
    }
    assert expected <= set(_run_configs())


@pytest.mark.parametrize("name", _run_configs())
def test_every_shipped_run_config_loads(name: str) -> None:
    config = load_config_from_files(REPO_CONFIGS, name)
    assert config.model_name and config.num_prompts_per_global_batch >= 1
    assert config.model.num_layers >= 1 and config.model.padded_vocab_size


def test_shipped_cluster_layouts_follow_the_paper() -> None:
    moe = load_config_from_files(REPO_CONFIGS, "grpo_qwen3_30b_a3b_asp_A3")
    assert (moe.num_prompts_per_global_batch, moe.rl_config.n_samples_per_prompt) == (16, 8)
    parallel = moe.actor_config.parallel
    assert (parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size) == (4, 1)
    assert parallel.expert_model_parallel_size == 4 and moe.model.num_experts == 128
    workers = moe.async_config.num_generation_units * moe.async_config.actors_per_unit
    assert (workers, moe.async_config.actor_tensor_parallel_size) == (16, 2)
    dense = load_config_from_files(REPO_CONFIGS, "grpo_qwen3_32b_asp_A3")
    assert dense.num_prompts_per_global_batch == 32
    assert dense.actor_config.parallel.pipeline_model_parallel_size == 2
    for config in (moe, dense):
        assert config.rl_config.max_prompt_length == 1024
        assert config.generate_config.sampling_config.max_tokens == 8192


def test_hydra_overrides_reach_the_typed_config() -> None:
    config = load_config_from_files(
        REPO_CONFIGS, "grpo_tiny_cpu", ["rl_config.pipeline=async", "run_dir=/tmp/x"]
    )
    assert config.rl_config.pipeline == "async" and config.run_dir == "/tmp/x"


def test_an_override_may_set_a_schema_key_the_yaml_does_not_mention() -> None:
    # Upstream users type section.key=value, never Hydra's +section.key=value.
    config = load_config_from_files(
        REPO_CONFIGS, "grpo_tiny_cpu", ["megatron_training.eval_interval=5", "rl_config.kl_target=0.2"]
    )
    assert config.megatron_training.training.eval_interval == 5 and config.rl_config.kl_target == 0.2
    with pytest.raises(ConfigError, match="eval_interval"):
        load_config_from_files(REPO_CONFIGS, "grpo_tiny_cpu", ["megatron_training.eval_intervall=5"])


def test_the_two_calibration_switches_have_separate_unambiguous_keys() -> None:
    config = load_config(
        _raw(
            asp_config={"calibrate_loads": True, "predictor": {"type": "oracle_noisy", "calibrate_nu": False}}
        )
    )
    assert config.asp_config.calibrate_loads and not config.asp_config.predictor.calibrate_nu
    # The old ambiguous key is gone; the loader points at its closest replacement.
    assert "asp_config: unknown key 'calibrate'" in _error(_raw(asp_config={"calibrate": True}))
    tiny = load_config_from_files(REPO_CONFIGS, "grpo_tiny_asp")
    assert tiny.asp_config.predictor.calibrate_nu and not tiny.asp_config.calibrate_loads
