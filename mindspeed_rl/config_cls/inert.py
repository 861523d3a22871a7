"""Which of the keys a user set have no effect here: Megatron/NPU-only keys (on the torch engine,
or everywhere), and whole sections the chosen pipeline does not read."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from mindspeed_rl.config_cls.fields import Engine, inert_reason, torch_inert_reason
from mindspeed_rl.config_cls.grpo_config import InertKey
from mindspeed_rl.config_cls.megatron_config import MEGATRON_FIELDS
from mindspeed_rl.config_cls.tool_configs import ProfilerRoleConfig

_ASYNC_ONLY = "read only when rl_config.pipeline = async"
_HYBRID_ONLY = "hybrid rollout layout; async actors use async_config.actor_*_parallel_size"
# What the chosen pipeline leaves unread (also read by tools/gen_config_reference.py).
ASYNC_ONLY_SECTIONS: dict[str, str] = {"asp_config": _ASYNC_ONLY, "async_config": _ASYNC_ONLY}
HYBRID_ONLY_KEYS: dict[tuple[str, str], str] = {
    ("generate_config", "infer_tensor_parallel_size"): _HYBRID_ONLY,
    ("generate_config", "infer_expert_parallel_size"): _HYBRID_ONLY,
}
# Role sections the megatron engine never reads its layout from (every role trains like the actor).
_OTHER_ROLES = ("ref_config", "reward_config", "critic_config")
_SHARES_ACTOR_LAYOUT = (
    "the megatron engine reads actor_config's; every role shares the actor's engine and layout"
)


def megatron_inert_keys(origins: Mapping[str, str], *, megatron_engine: bool) -> list[InertKey]:
    """Inert keys among one role's merged keys (``origins``: key -> the section it came from).

    ``megatron_engine`` is the run's engine choice, ``actor_config``'s ``use_mcore_models`` (as in
    ``plan.sections.megatron_layout``). On it, the engine-dependent keys act when they reach the
    actor (from the model file, megatron_training or actor_config); set in another role's section
    they still have no effect. Keys no engine reads give the reason of the engine that runs.
    """
    engine: Engine = "megatron" if megatron_engine else "torch"
    out = []
    for key, section in origins.items():
        field = MEGATRON_FIELDS[key]
        reason = inert_reason(field, engine)
        if reason is None and torch_inert_reason(field) is not None:
            if not megatron_engine:
                reason = torch_inert_reason(field)
            elif section in _OTHER_ROLES:
                reason = _SHARES_ACTOR_LAYOUT
        if reason is not None:
            out.append(InertKey(section=section, key=key, reason=reason))
    return out


def section_inert_keys(cls: type, raw: Any, where: str, engine: Engine) -> list[InertKey]:
    """Inert keys among those given in ``raw`` for dataclass ``cls`` (recursing into sections),
    with the reason on the training ``engine`` that runs."""
    if not isinstance(raw, Mapping):
        return []
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        reason = inert_reason(f, engine)
        if reason is not None:
            out.append(InertKey(section=where, key=f.name, reason=reason))
        elif dataclasses.is_dataclass(hints[f.name]):
            out += section_inert_keys(hints[f.name], raw[f.name], f"{where}.{f.name}", engine)
    return out


def profiler_inert_keys(raw: Any, engine: Engine) -> list[InertKey]:
    if not isinstance(raw, Mapping):
        return []
    out = []
    for role, role_raw in raw.items():
        out += section_inert_keys(ProfilerRoleConfig, role_raw, f"profiler_config.{role}", engine)
    return out


def pipeline_inert_keys(raw: Mapping[str, Any], pipeline: str) -> list[InertKey]:
    out = []
    if pipeline == "hybrid":
        out += [
            InertKey(section=s, key="*", reason=reason)
            for s, reason in ASYNC_ONLY_SECTIONS.items()
            if raw.get(s)
        ]
    else:
        out += [
            InertKey(section=s, key=k, reason=reason)
            for (s, k), reason in HYBRID_ONLY_KEYS.items()
            if k in (raw.get(s) or {})
        ]
    return out


def dedupe(keys: list[InertKey]) -> tuple[InertKey, ...]:
    seen: dict[tuple[str, str], InertKey] = {}
    for k in keys:
        seen.setdefault((k.section, k.key), k)
    return tuple(sorted(seen.values(), key=lambda k: (k.section, k.key)))


def grouped_lines(keys: Sequence[InertKey]) -> list[str]:
    """One line per section for the run's start-up warning: its keys, those sharing a reason
    together, e.g. ``megatron_training: a, b: why | c: why``. Sections and keys keep their order."""
    by_section: dict[str, dict[str, list[str]]] = {}
    for k in keys:
        by_section.setdefault(k.section, {}).setdefault(k.reason, []).append(k.key)
    return [
        f"{section}: " + " | ".join(f"{', '.join(names)}: {reason}" for reason, names in reasons.items())
        for section, reasons in by_section.items()
    ]
