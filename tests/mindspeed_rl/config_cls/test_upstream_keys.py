"""Every key upstream MindSpeed-RL accepts is known to the schema and classified on its field:
honoured (read by the run plan: ``plan/test_build_coverage.py``), inert with a reason, or refused
naming the feature. ``upstream_key_names.json`` holds upstream's key names per section."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import pytest

from mindspeed_rl.config_cls import (
    GenerateConfig,
    MsprobeConfig,
    ProfilerRoleConfig,
    RLConfig,
    SamplingConfig,
    load_config,
    load_config_from_files,
)
from mindspeed_rl.config_cls.fields import field_default, inert_reason, refusal, torch_inert_reason
from mindspeed_rl.config_cls.megatron_config import MEGATRON_FIELDS, MEGATRON_KEY_GROUP, MegatronConfig
from mindspeed_rl.config_cls.parse import ConfigError

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
UPSTREAM = json.loads((Path(__file__).with_name("upstream_key_names.json")).read_text())
SCHEMA: dict[str, Mapping[str, dataclasses.Field[Any]]] = {
    "megatron": MEGATRON_FIELDS,
    "model_yaml": MEGATRON_FIELDS,
    **{
        section: {f.name: f for f in dataclasses.fields(cls)}
        for section, cls in (
            ("rl_config", RLConfig),
            ("generate_config", GenerateConfig),
            ("generate_config.sampling_config", SamplingConfig),
            ("profiler_config", ProfilerRoleConfig),
            ("msprobe_config", MsprobeConfig),
        )
    },
}
SECTIONS = [s for s in UPSTREAM if not s.startswith("_")]


def classify(f: dataclasses.Field[Any]) -> str:
    if refusal(f) is not None:
        return "refused"
    if inert_reason(f) is not None:
        return "inert"
    return "honoured"  # plan/test_build_coverage.py fails naming it unless the plan reads it


def test_the_key_list_covers_every_upstream_section() -> None:
    assert set(SECTIONS) == set(SCHEMA)
    assert len(UPSTREAM["megatron"]) == 174 and len(UPSTREAM["rl_config"]) == 106


@pytest.mark.parametrize("section", SECTIONS)
def test_every_upstream_key_is_a_classified_schema_field(section: str) -> None:
    unknown = [key for key in UPSTREAM[section] if key not in SCHEMA[section]]
    assert not unknown, f"{section}: upstream keys the schema would call unknown: {unknown}"
    for key in UPSTREAM[section]:
        f = SCHEMA[section][key]
        kind = classify(f)
        if kind == "refused":
            assert (
                "not supported" in str(refusal(f))
                or "not implemented" in str(refusal(f))
                or ("no counterpart" in str(refusal(f)))
            ), f"{section}.{key}: a refusal names the missing feature"
        if kind == "inert":
            assert len(str(inert_reason(f))) >= 10, f"{section}.{key}: an inert key says why"
        assert kind != "refused" or torch_inert_reason(f) is None, key


# --- every refused field refuses a value that asks for something, naming section.key -------------


def _non_default(hint: Any, default: Any) -> Any:
    """A YAML value of ``hint``'s type that differs from ``default``."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _non_default(options[0], default)
    if hint is bool:
        return not default
    if hint is int:
        return (default or 0) + 3
    if hint is float:
        return float(default or 0) + 1.5
    if hint is str or hint is Any:
        return "x-unsupported"
    if origin is tuple:
        return ["x-unsupported"]
    if dataclasses.is_dataclass(hint):
        return {"num_npus": 2}
    raise AssertionError(f"no sample value for {hint!r}")


def _refused_fields() -> list[tuple[str, str, Any]]:
    """(section to write the key in, key, a non-default value) of every refused field."""
    out = []
    groups = typing.get_type_hints(MegatronConfig)
    for key, f in MEGATRON_FIELDS.items():
        if refusal(f) is not None:
            hint = typing.get_type_hints(groups[MEGATRON_KEY_GROUP[key]])[key]
            out.append(("actor_config", key, _non_default(hint, field_default(f))))
    for section, cls in (("rl_config", RLConfig), ("generate_config", GenerateConfig)):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if refusal(f) is not None:
                out.append((section, f.name, _non_default(hints[f.name], field_default(f))))
    return out


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    return load_config_from_files(CONFIGS, "grpo_tiny_cpu").to_dict()


REFUSED = _refused_fields()


def test_the_refused_families_are_all_there() -> None:
    keys = {key for _, key, _ in REFUSED}
    families = {"lora_r", "multi_latent_attention", "q_lora_rank", "rope_scaling_type", "dpo_loss_type",
                "is_pairwise_dataset", "is_multimodal", "mm_model",
                "spec",
                "attention_bias", "moe_router_score_function", "critic_resource", "stage"}  # fmt: skip
    assert families <= keys, families - keys


@pytest.mark.parametrize(("section", "key", "value"), REFUSED, ids=[f"{s}.{k}" for s, k, _ in REFUSED])
def test_a_non_default_value_of_a_refused_key_is_an_error_naming_it(
    tiny: dict[str, Any], section: str, key: str, value: Any
) -> None:
    raw = {**tiny, section: {**tiny.get(section, {}), key: value}}
    with pytest.raises(ConfigError) as err:
        load_config(raw)
    f = SCHEMA["megatron" if section == "actor_config" else section][key]
    assert f"{section}.{key}: {refusal(f)}" in str(err.value)
    assert "unknown key" not in str(err.value)


def test_the_default_and_accepted_values_of_refused_keys_pass(tiny: dict[str, Any]) -> None:
    actor = {
        **tiny["actor_config"],
        "lora_r": 8,
        "attention_bias": False,
        "stage": "ray_dapo",
        "spec": ["mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec"],
        "pipeline_model_parallel_size": 2,
        "num_layer_list": f"{tiny['actor_config']['num_layers'] // 2},{tiny['actor_config']['num_layers'] // 2}",
    }
    config = load_config(
        {**tiny, "actor_config": actor, "rl_config": {**tiny["rl_config"], "multi_turn_enable": False}}
    )
    inert = {(k.section, k.key) for k in config.inert_keys}
    # Accepted values that say what the engines do anyway are listed as having no effect.
    assert {("actor_config", "stage"), ("actor_config", "spec"), ("actor_config", "num_layer_list")} <= inert


def test_pipeline_stage_keys_are_the_megatron_engines(tiny: dict[str, Any]) -> None:
    # Uneven stages and noop layers act on the megatron engine (plan/pipeline.py; issue #42); on
    # the torch engine, which trains one unsharded replica, they have no effect.
    actor = {**tiny["actor_config"], "num_layers": 4, "pipeline_model_parallel_size": 2}
    config = load_config({**tiny, "actor_config": {**actor, "num_layer_list": "3,1", "noop_layers": "3"}})
    inert = {(k.section, k.key) for k in config.inert_keys}
    assert {("actor_config", "num_layer_list"), ("actor_config", "noop_layers")} <= inert


def test_a_critic_config_section_is_refused_as_ppo(tiny: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="critic_config: PPO with a critic is not supported"):
        load_config({**tiny, "critic_config": {"lr": 1e-6}})


def test_dapo_keys_are_honoured_and_checked(tiny: dict[str, Any]) -> None:
    rl = {
        **tiny["rl_config"],
        "overlong_buffer_enable": True,
        "overlong_buffer": 32,
        "rollout_max_tokens": 64,
        "filter_groups_enable": True,
        "filter_groups_metric": tiny["rl_config"]["verifier_function"][0],
        "filter_groups_train_batch_size": tiny["megatron_training"]["global_batch_size"],
        "filter_groups_max_batches": -1,
    }
    config = load_config({**tiny, "rl_config": rl})
    assert not [k for k in config.inert_keys if k.key.startswith(("overlong", "filter_groups"))]
    for bad, phrase in [
        ({"overlong_buffer": 0}, "rl_config.overlong_buffer"),
        ({"overlong_buffer": 65}, "must be in 1..rollout_max_tokens (64)"),
        ({"filter_groups_metric": "format"}, "is not one of verifier_function"),
        ({"filter_groups_max_batches": 0}, "rl_config.filter_groups_max_batches"),
        ({"filter_groups_train_batch_size": 0}, "must be >= 1 kept prompt per step, got 0"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(phrase)):
            load_config({**tiny, "rl_config": {**rl, **bad}})


def test_typos_still_name_the_nearest_key_in_the_larger_key_set(tiny: dict[str, Any]) -> None:
    cases = {
        ("actor_config", "lora_rr"): "did you mean 'lora_r'?",
        ("actor_config", "noop_layer"): "did you mean 'noop_layers'?",
        ("rl_config", "overlong_bufer"): "did you mean 'overlong_buffer'?",
        ("rl_config", "reward_dispatch_sise"): "did you mean 'reward_dispatch_size'?",
        ("generate_config", "num_scheduler_step"): "did you mean 'num_scheduler_steps'?",
    }
    for (section, key), hint in cases.items():
        with pytest.raises(ConfigError) as err:
            load_config({**tiny, section: {**tiny[section], key: 1}})
        assert f"unknown key '{key}'; {hint}" in str(err.value)
