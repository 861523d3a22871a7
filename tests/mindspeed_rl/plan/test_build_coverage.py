"""Every schema field is read by the run plan, declared inert or refused: no key a user sets is
ignored without a report. The plan is built through a recording proxy over configs that exercise every
branch of the mapper (both pipelines, the shipped YAMLs, the algorithm variants)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mindspeed_rl.config_cls import GRPOConfig, load_config_from_files
from mindspeed_rl.config_cls.coverage import FieldRef, record_reads, unread_fields
from mindspeed_rl.config_cls.fields import opt
from mindspeed_rl.plan.build import build_run_plan

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SHIPPED = sorted(p.stem for p in [*CONFIGS.glob("grpo_*.yaml"), *CONFIGS.glob("dapo_*.yaml")])
# "++" adds or overrides: most of these keys are absent from the shipped YAML.
VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "grpo_tiny_cpu",
        (
            "++rl_config.kl_ctrl_type=adaptive", "++rl_config.kl_target=0.1", "++rl_config.kl_horizon=1000",
            "++rl_config.clip_higher_enable=true", "++rl_config.use_kl_in_reward=true",
            "++rl_config.token_level_loss=false", "++actor_config.lr_decay_style=cosine",
            "++actor_config.lr_warmup_fraction=0.1", "++megatron_training.eval_interval=5",
            "++megatron_training.eval_iters=1", "megatron_training.split='90,10,0'", "++rl_config.use_wandb=true",
        ),
    ),
    ("grpo_tiny_cpu", ("++actor_config.lr_decay_style=linear", "++actor_config.lr_warmup_iters=3",
                       "++actor_config.lr_decay_iters=20")),
    ("grpo_tiny_asp", ("++async_config.max_policy_lag=null",)),
    ("grpo_tiny_asp", ("++async_config.role_envs.trainer.python=/envs/trainer/bin/python",
                       "++async_config.role_envs.rollout.env_vars.PYTHONPATH=/src")),
)  # fmt: skip


def _reads() -> set[FieldRef]:
    reads: set[FieldRef] = set()
    for name in SHIPPED:
        build_run_plan(record_reads(load_config_from_files(CONFIGS, name), reads))
    for name, overrides in VARIANTS:
        build_run_plan(record_reads(load_config_from_files(CONFIGS, name, overrides), reads))
    return reads


def test_every_schema_field_is_read_by_the_plan_or_inert() -> None:
    unread = unread_fields(GRPOConfig, _reads())
    assert not unread, (
        "schema fields neither read by plan/build.py nor marked inert or refused "
        "(fields.opt(inert=...) / fields.opt(refused=...)): " + ", ".join(unread)
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Section:
    used: int = opt(1, "read")
    forgotten: int = opt(2, "a field added without a reader")
    ignored: int = opt(3, "inert", inert="declared inert")
    engine_only: int = opt(4, "read by one engine only", inert_on_torch="inert on the other engine")
    unsupported: int = opt(5, "a feature the loader refuses", refused="the feature is not supported")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Root:
    section: _Section = dataclasses.field(default_factory=_Section)


def test_the_checker_names_a_new_field_nobody_reads() -> None:
    reads: set[FieldRef] = set()
    proxy = record_reads(_Root(), reads)
    assert proxy.section.used == 1
    # The refused field needs no reader (the loader refuses any value that would ask for it); the
    # forgotten one is still named.
    assert unread_fields(_Root, reads) == ["_Root.section.forgotten", "_Root.section.engine_only"]
    assert proxy.section.forgotten == 2
    # Inert on one engine is not inert: the plan must still read it (when that engine is chosen).
    assert unread_fields(_Root, reads) == ["_Root.section.engine_only"]
    assert proxy.section.engine_only == 4
    assert unread_fields(_Root, reads) == []


def test_properties_and_methods_record_the_fields_they_read() -> None:
    config = load_config_from_files(CONFIGS, "grpo_tiny_cpu")
    reads: set[FieldRef] = set()
    proxy = record_reads(config, reads)
    assert proxy.mini_batch_prompts == config.mini_batch_prompts
    names = {name for _, name in reads}
    assert {"global_batch_size", "mini_batch_size"} <= names


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_builds_a_plan(name: str) -> None:
    plan = build_run_plan(load_config_from_files(CONFIGS, name))
    assert plan.trainer.engine.mini_batch_size >= 1
    assert (plan.runtime is None) == (plan.pipeline == "hybrid")
