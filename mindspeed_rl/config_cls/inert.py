"""Which of the keys a user set have no effect here: Megatron/NPU-only keys on the torch backend,
and whole sections the chosen pipeline does not read."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from mindspeed_rl.config_cls.fields import inert_reason
from mindspeed_rl.config_cls.grpo_config import InertKey
from mindspeed_rl.config_cls.megatron_config import MEGATRON_FIELDS
from mindspeed_rl.config_cls.tool_configs import ProfilerRoleConfig

_ASYNC_ONLY = "read only when rl_config.pipeline = async"
_HYBRID_ONLY = "hybrid rollout layout; async actors use async_config.actor_*_parallel_size"


def megatron_inert_keys(origins: Mapping[str, str]) -> list[InertKey]:
    out = []
    for key, section in origins.items():
        reason = inert_reason(MEGATRON_FIELDS[key])
        if reason is not None:
            out.append(InertKey(section=section, key=key, reason=reason))
    return out


def section_inert_keys(cls: type, raw: Any, where: str) -> list[InertKey]:
    """Inert keys among those given in ``raw`` for dataclass ``cls`` (recursing into sections)."""
    if not isinstance(raw, Mapping):
        return []
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        reason = inert_reason(f)
        if reason is not None:
            out.append(InertKey(section=where, key=f.name, reason=reason))
        elif dataclasses.is_dataclass(hints[f.name]):
            out += section_inert_keys(hints[f.name], raw[f.name], f"{where}.{f.name}")
    return out


def profiler_inert_keys(raw: Any) -> list[InertKey]:
    if not isinstance(raw, Mapping):
        return []
    out = []
    for role, role_raw in raw.items():
        out += section_inert_keys(ProfilerRoleConfig, role_raw, f"profiler_config.{role}")
    return out


def pipeline_inert_keys(raw: Mapping[str, Any], pipeline: str) -> list[InertKey]:
    out = []
    if pipeline == "hybrid":
        out += [
            InertKey(section=s, key="*", reason=_ASYNC_ONLY)
            for s in ("asp_config", "async_config")
            if raw.get(s)
        ]
    else:
        given = raw.get("generate_config") or {}
        out += [
            InertKey(section="generate_config", key=k, reason=_HYBRID_ONLY)
            for k in ("infer_tensor_parallel_size", "infer_expert_parallel_size")
            if k in given
        ]
    return out


def dedupe(keys: list[InertKey]) -> tuple[InertKey, ...]:
    seen: dict[tuple[str, str], InertKey] = {}
    for k in keys:
        seen.setdefault((k.section, k.key), k)
    return tuple(sorted(seen.values(), key=lambda k: (k.section, k.key)))
