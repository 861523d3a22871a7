"""Key spellings as upstream accepts them: ``min-lr`` is the key ``min_lr``.

Upstream's config classes read every section key with ``-`` turned into ``_`` (megatron's
argparse writes its options hyphenated, and users paste them into YAML), so its recipes may say
``min-lr`` where our schema says ``min_lr``. This pass makes a copy of the composed config in which
every key that names a schema field is spelled with underscores, before anything else reads it:
the unknown-key check, the inert and refusal reports and the typed parsing then see one spelling.

Only keys of schema sections are respelled (each section, the model architecture, a profiler
role, and nested schema sections such as ``generate_config.sampling_config``); mappings whose keys
are the user's own names (``map_keys`` columns, a model or role name) keep them as written. A key
given both ways in one mapping is ambiguous (which value did the user mean?), so it is an error
naming both spellings. The input is only read.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Union

from mindspeed_rl.config_cls.asp_config import ASPConfig
from mindspeed_rl.config_cls.async_config import AsyncConfig
from mindspeed_rl.config_cls.generate_config import GenerateConfig
from mindspeed_rl.config_cls.parse import Problems
from mindspeed_rl.config_cls.rl_config import RLConfig
from mindspeed_rl.config_cls.rollout_correction import RolloutCorrectionSection
from mindspeed_rl.config_cls.tool_configs import MsprobeConfig, ProfilerRoleConfig
from mindspeed_rl.config_cls.warmup_config import WarmupConfig

# Sections parsed into one dataclass (nested dataclass fields are respelled too).
_DATACLASS_SECTIONS: Mapping[str, type] = {
    "rl_config": RLConfig,
    "generate_config": GenerateConfig,
    "asp_config": ASPConfig,
    "async_config": AsyncConfig,
    "warmup_config": WarmupConfig,
    "msprobe_config": MsprobeConfig,
    "rollout_correction": RolloutCorrectionSection,
}
# Sections of the flat Megatron key space (no nested sections).
_MEGATRON_SECTIONS = ("megatron_training", "actor_config", "ref_config", "reward_config", "critic_config")


def underscored(raw: Mapping[str, Any], problems: Problems) -> dict[str, Any]:
    """A copy of ``raw`` with every schema key spelled with ``_``; both spellings -> a problem."""
    out = dict(raw)
    for name in _MEGATRON_SECTIONS:
        if isinstance(raw.get(name), Mapping):
            out[name] = _respell(raw[name], name, problems, None)
    for name, cls in _DATACLASS_SECTIONS.items():
        if isinstance(raw.get(name), Mapping):
            out[name] = _respell(raw[name], name, problems, cls)
    models = raw.get("model")
    if isinstance(models, Mapping):
        out["model"] = {
            model: _respell(arch, f"model.{model}", problems, None) if isinstance(arch, Mapping) else arch
            for model, arch in models.items()
        }
    profiler = raw.get("profiler_config")
    if isinstance(profiler, Mapping):
        out["profiler_config"] = {
            role: _respell(keys, f"profiler_config.{role}", problems, ProfilerRoleConfig)
            if isinstance(keys, Mapping)
            else keys
            for role, keys in profiler.items()
        }
    return out


def _respell(raw: Mapping[str, Any], where: str, problems: Problems, cls: type | None) -> dict[str, Any]:
    """One schema mapping respelled; ``cls`` (when a dataclass) says which values are sections."""
    hints = typing.get_type_hints(cls) if cls is not None else {}
    written: dict[str, str] = {}  # underscored key -> the spelling it was first given as
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            out[key] = value  # the unknown-key check reports a non-string key
            continue
        name = key.replace("-", "_")
        if name in written:
            problems.add(
                where,
                f"'{written[name]}' and '{key}' are the same key ('-' reads as '_', as upstream "
                f"reads it); give it once",
            )
            continue
        written[name] = key
        nested = _section_class(hints.get(name))
        out[name] = (
            _respell(value, f"{where}.{name}", problems, nested)
            if nested and isinstance(value, Mapping)
            else value
        )
    return out


def _section_class(hint: Any) -> type | None:
    """The dataclass a field's value is parsed into (``X`` or ``X | None``), else None."""
    if hint is None:
        return None
    if typing.get_origin(hint) in (Union, types.UnionType):
        options = [h for h in typing.get_args(hint) if h is not type(None)]
        hint = options[0] if len(options) == 1 else None
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None
