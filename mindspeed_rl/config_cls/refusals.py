"""Values that ask for a feature this framework does not have (``fields.opt(refused=...)``).

The loader runs these checks on the parsed sections, next to the unknown-key and type checks, so
``check_config`` lists every such key at once, each as ``section.key: <feature> is not supported
...``, before any plan, model or data work. A refused key left at upstream's default (or at one of
its ``accepts`` values) asks for nothing and passes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mindspeed_rl.config_cls.fields import accepted, field_default, refusal
from mindspeed_rl.config_cls.megatron_config import MEGATRON_FIELDS, MEGATRON_KEY_GROUP, MegatronConfig
from mindspeed_rl.config_cls.parse import Problems

PPO_WITH_CRITIC = (
    "PPO with a critic is not supported: this framework trains GRPO (group_norm advantages, no value "
    "model); remove the section"
)


def megatron_refusals(
    roles: Mapping[str, MegatronConfig],
    origins: Mapping[str, Mapping[str, str]],
    actor: MegatronConfig,
    problems: Problems,
) -> None:
    """Refused Megatron keys among those given, per role (``origins``: role -> key -> the section
    the value came from). Cross-key acceptance (``accepts`` predicates) is judged against the
    actor's resolved keys: every role trains with the actor's engine and layout."""
    for role, config in roles.items():
        for key, section in origins.get(role, {}).items():
            f = MEGATRON_FIELDS[key]
            reason = refusal(f)
            if reason is None:
                continue
            value = getattr(getattr(config, MEGATRON_KEY_GROUP[key]), key)
            if not accepted(f, value, actor):
                problems.add(f"{section}.{key}", _message(reason, value, f))


def section_refusals(section: Any, where: str, problems: Problems) -> None:
    """Refused fields of one parsed section, nested sections (and mappings of them) included."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        reason = refusal(f)
        if reason is not None:
            if not accepted(f, value, section):
                problems.add(f"{where}.{f.name}", _message(reason, value, f))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            section_refusals(value, f"{where}.{f.name}", problems)
        elif isinstance(value, Mapping):
            for name, item in value.items():
                if dataclasses.is_dataclass(item) and not isinstance(item, type):
                    section_refusals(item, f"{where}.{f.name}.{name}", problems)


def _message(reason: str, value: Any, f: dataclasses.Field[Any]) -> str:
    default = field_default(f)
    if dataclasses.is_dataclass(default):
        back = "remove it"
    else:
        back = f"remove the key or set upstream's default {_show(default)}"
    return f"{reason} (got {_show(value)}; {back})"


def _show(value: Any) -> str:
    """A value as the user wrote it in YAML (a nested section: only its non-default keys)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {
            f.name: getattr(value, f.name)
            for f in dataclasses.fields(value)
            if getattr(value, f.name) != field_default(f)
        }
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in changed.items()) + "}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    return str(value)
