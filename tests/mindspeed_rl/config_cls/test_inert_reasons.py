"""An inert key's reason is the one of the engine that runs: a megatron user is never told "the
torch backend ignores it" (which reads as a bug), and a reason declared for both engines names
neither alone."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

from mindspeed_rl.config_cls import GRPOConfig, load_config_from_files
from mindspeed_rl.config_cls.fields import ByEngine, inert_reasons
from mindspeed_rl.config_cls.grpo_config import InertKey
from mindspeed_rl.config_cls.inert import grouped_lines
from mindspeed_rl.config_cls.megatron_config import MEGATRON_FIELDS
from mindspeed_rl.plan.sections import plan_inert_keys

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
ONE_ENGINE = re.compile(r"torch (backend|engine)|megatron (backend|engine)", re.IGNORECASE)
RECIPE = "grpo_qwen3_30b_a3b_asp_A3"  # use_mcore_models: true, MoE, distributed_backend: nccl


def _schema_fields() -> list[tuple[str, dataclasses.Field[Any]]]:
    out: list[tuple[str, dataclasses.Field[Any]]] = [(f"megatron.{k}", f) for k, f in MEGATRON_FIELDS.items()]
    seen: set[type] = set()

    def walk(cls: type, where: str) -> None:
        if cls in seen:
            return
        seen.add(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            out.append((f"{where}.{f.name}", f))
            for arg in (hints[f.name], *typing.get_args(hints[f.name])):
                for inner in (arg, *typing.get_args(arg)):
                    if dataclasses.is_dataclass(inner) and isinstance(inner, type):
                        walk(inner, f"{where}.{f.name}")

    walk(GRPOConfig, "config")
    return out


def test_a_reason_given_for_both_engines_names_neither_alone() -> None:
    fields = _schema_fields()
    assert len(fields) > 400
    one_engine = [
        path
        for path, f in fields
        if isinstance(inert_reasons(f), str)
        and ONE_ENGINE.search(str(inert_reasons(f)))
        and "both engines" not in str(inert_reasons(f))
    ]
    assert not one_engine, f"declare these with fields.ByEngine (a reason per engine): {one_engine}"
    split = [f for _, f in fields if isinstance(inert_reasons(f), ByEngine)]
    assert split and all("torch" in r.torch and "megatron" in r.megatron for r in map(inert_reasons, split))


def test_the_megatron_recipe_gets_the_megatron_engines_reasons() -> None:
    reasons = {
        f"{k.section}.{k.key}": k.reason for k in plan_inert_keys(load_config_from_files(CONFIGS, RECIPE))
    }
    dispatcher = "model.qwen3_30b_a3b.moe_token_dispatcher_type"
    assert "allgather on CPU, alltoall on GPU and NPU" in reasons[dispatcher]
    assert "gloo on CPU, nccl on GPU, hccl on NPU" in reasons["megatron_training.distributed_backend"]
    assert not {key: r for key, r in reasons.items() if "torch" in r}


def test_the_same_keys_on_the_torch_engine_get_the_torch_engines_reasons() -> None:
    config = load_config_from_files(CONFIGS, RECIPE, ["megatron_training.use_mcore_models=false"])
    reasons = {f"{k.section}.{k.key}": k.reason for k in config.inert_keys}
    assert "torch engine" in reasons["model.qwen3_30b_a3b.moe_token_dispatcher_type"]
    assert "torch engine" in reasons["megatron_training.distributed_backend"]
    assert "torch backend" in reasons["actor_config.tensor_model_parallel_size"]  # read by megatron only


def test_grouped_lines_give_one_line_per_section_keys_sharing_a_reason_together() -> None:
    keys = [
        InertKey(section="megatron_training", key="a", reason="why 1"),
        InertKey(section="megatron_training", key="b", reason="why 2"),
        InertKey(section="megatron_training", key="c", reason="why 1"),
        InertKey(section="rl_config", key="d", reason="why 3"),
    ]
    assert grouped_lines(keys) == ["megatron_training: a, c: why 1 | b: why 2", "rl_config: d: why 3"]
    assert grouped_lines([]) == []
