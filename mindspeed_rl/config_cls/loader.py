"""Turn a Hydra-composed config (or a plain mapping) into a validated, frozen ``GRPOConfig``.

Hydra only loads and composes YAML; the dataclasses are the schema. The user's containers are
read, never written: ``OmegaConf.to_container`` makes a resolved copy and parsing builds new
frozen objects from it.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mindspeed_rl.config_cls import inert, refusals, spellings
from mindspeed_rl.config_cls.asp_config import ASPConfig
from mindspeed_rl.config_cls.async_config import AsyncConfig
from mindspeed_rl.config_cls.fields import Engine
from mindspeed_rl.config_cls.generate_config import GenerateConfig
from mindspeed_rl.config_cls.grpo_config import GRPOConfig
from mindspeed_rl.config_cls.megatron_config import MegatronConfig, build_megatron_config
from mindspeed_rl.config_cls.parse import ConfigError, Problems, check_keys, parse_dataclass
from mindspeed_rl.config_cls.rl_config import RLConfig
from mindspeed_rl.config_cls.rollout_correction import RolloutCorrectionSection
from mindspeed_rl.config_cls.tool_configs import MsprobeConfig, ProfilerRoleConfig
from mindspeed_rl.config_cls.validate import validate
from mindspeed_rl.config_cls.warmup_config import WarmupConfig

ROLE_SECTIONS = ("actor_config", "ref_config", "reward_config", "critic_config")
TOP_LEVEL_KEYS = (
    "model", "megatron_training", *ROLE_SECTIONS, "rl_config", "generate_config", "asp_config",
    "async_config", "warmup_config", "profiler_config", "msprobe_config", "rollout_correction", "run_dir",
)  # fmt: skip
# Upstream YAML lists `- model: [...]` in defaults without `_self_`; Hydra then warns about a
# composition order that is exactly the one upstream relies on (the file's own keys last).
SELF_WARNING = ".*Defaults list is missing `_self_`.*"


def load_config(cfg: DictConfig | Mapping[str, Any]) -> GRPOConfig:
    """Validate a composed config. Raises ``ConfigError`` (a ``ValueError``) listing every problem."""
    problems = Problems()
    raw = spellings.underscored(_plain(cfg), problems)
    _check_top_level(raw, problems)
    model_name, arch = _select_model(raw, problems)
    base: list[tuple[str, Any]] = [
        (f"model.{model_name}", arch),
        ("megatron_training", raw.get("megatron_training")),
    ]
    megatron, origins = build_megatron_config(base, problems)
    roles: dict[str, MegatronConfig | None] = {}
    role_origins: dict[str, dict[str, str]] = {"megatron_training": origins}
    for role in ROLE_SECTIONS:
        if role not in raw and role in ("reward_config", "critic_config"):
            roles[role] = None
            continue
        roles[role], role_origins[role] = build_megatron_config([*base, (role, raw.get(role))], problems)
    # The engine that decides which Megatron keys act (``plan.sections.megatron_layout``).
    megatron_engine = _present(roles["actor_config"]).megatron_only.use_mcore_models
    inert_found = []
    for role_keys in role_origins.values():
        inert_found += inert.megatron_inert_keys(role_keys, megatron_engine=megatron_engine)
    sections = _parse_sections(raw, problems)
    _refuse(raw, megatron, roles, role_origins, sections, problems)
    run_dir = raw.get("run_dir", "runs")
    if not isinstance(run_dir, str) or not run_dir:
        problems.add("run_dir", f"expected a folder path string, got {run_dir!r}")
        run_dir = "runs"
    problems.raise_if_any()
    inert_found += _section_inert_keys(raw, sections["rl_config"].pipeline, megatron_engine)
    config = GRPOConfig(
        model_name=model_name,
        megatron_training=megatron,
        actor_config=_present(roles["actor_config"]),
        ref_config=_present(roles["ref_config"]),
        reward_config=roles["reward_config"],
        critic_config=roles["critic_config"],
        run_dir=run_dir,
        inert_keys=inert.dedupe(inert_found),
        **sections,
    )
    validate(config, problems)
    problems.raise_if_any()
    return config


def schema_overrides(overrides: Sequence[str]) -> list[str]:
    """Let ``section.key=value`` set a schema key the YAML does not mention.

    Hydra's struct mode rejects an override of a key absent from the composed YAML unless it is
    written ``+key=value``, which upstream users do not type (``megatron_training.eval_interval=5``
    on a YAML without eval_interval). The schema, not the YAML, decides which keys exist, so a
    dotted plain override becomes Hydra's ``++`` (set, adding if absent) and a misspelt key still
    fails, in ``load_config``, with the nearest valid name. Group selections (``model=x``), Hydra's
    own keys and overrides that already carry ``+``/``~`` are left as written.
    """
    out = []
    for item in overrides:
        key = item.split("=", 1)[0]
        plain = "=" in item and "." in key and not item.startswith(("+", "~", "hydra.", "hydra/"))
        out.append(f"++{item}" if plain else item)
    return out


def compose_config(config_dir: str | Path, config_name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``<config_dir>/<config_name>.yaml`` with Hydra (defaults list + overrides), without running."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    directory = Path(config_dir).expanduser().resolve()
    name = config_name.removesuffix(".yaml")
    if not directory.is_dir():
        raise ConfigError(f"config directory {directory} does not exist; pass --config-dir DIR")
    if not (directory / f"{name}.yaml").is_file():
        available = sorted(p.stem for p in directory.glob("*.yaml"))
        near = difflib.get_close_matches(name, available, n=1)
        hint = f"did you mean '{near[0]}'?" if near else f"available: {', '.join(available) or 'none'}"
        raise ConfigError(f"no config '{name}.yaml' in {directory}; {hint}")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=SELF_WARNING)
            with initialize_config_dir(config_dir=str(directory), version_base="1.3"):
                return compose(config_name=name, overrides=schema_overrides(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"could not compose {directory / name}.yaml: {err}") from err


def load_config_from_files(
    config_dir: str | Path, config_name: str, overrides: Sequence[str] = ()
) -> GRPOConfig:
    return load_config(compose_config(config_dir, config_name, overrides))


def _plain(cfg: DictConfig | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(cfg, DictConfig):
        try:
            container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        except OmegaConfBaseException as err:
            raise ConfigError(f"could not resolve the config: {err}") from err
        assert isinstance(container, dict)
        return {str(k): v for k, v in container.items()}
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"expected a mapping of config sections, got {type(cfg).__name__}")
    return cfg


def _check_top_level(raw: Mapping[str, Any], problems: Problems) -> None:
    if "defaults" in raw:
        problems.add("defaults", "only Hydra composition understands it; use load_config_from_files")
    if "hydra" in raw:
        problems.add("hydra", "Hydra's own settings must not reach load_config; compose with Hydra first")
    check_keys(
        {k: v for k, v in raw.items() if k not in ("defaults", "hydra")}, TOP_LEVEL_KEYS, "config", problems
    )


def _select_model(raw: Mapping[str, Any], problems: Problems) -> tuple[str, Any]:
    """The architecture named by ``megatron_training.model`` in the composed ``model`` group."""
    models = raw.get("model") or {}
    if not isinstance(models, Mapping):
        problems.add(
            "model", "expected {name: {architecture keys}} (compose it via defaults: - model: [name])"
        )
        return "", None
    sections = [raw.get(s) for s in ("megatron_training", *ROLE_SECTIONS)]
    named = {s["model"] for s in sections if isinstance(s, Mapping) and s.get("model") is not None}
    if len(named) > 1:
        problems.add(
            "megatron_training.model", f"roles name different models {sorted(map(str, named))}; use one"
        )
        return "", None
    name = next(iter(named), None)
    if name is None:
        if len(models) > 1:
            problems.add(
                "megatron_training.model", f"several models composed ({', '.join(models)}); name one"
            )
            return "", None
        return next(iter(models.items()), ("", None))
    if name not in models:
        hint = f"composed: {', '.join(models)}" if models else "no model composed"
        problems.add(
            "megatron_training.model",
            f"'{name}' is not in the model group ({hint}); add `- model: [{name}]` to defaults "
            f"with configs/model/{name}.yaml holding a top-level key `{name}:`",
        )
        return "", None
    return str(name), models[name]


def _parse_sections(raw: Mapping[str, Any], problems: Problems) -> dict[str, Any]:
    profiler_raw = raw.get("profiler_config") or {}
    if not isinstance(profiler_raw, Mapping):
        problems.add("profiler_config", "expected {role: {profiler keys}}")
        profiler_raw = {}
    return {
        "rl_config": parse_dataclass(RLConfig, raw.get("rl_config"), "rl_config", problems),
        "generate_config": parse_dataclass(
            GenerateConfig, raw.get("generate_config"), "generate_config", problems
        ),
        "asp_config": parse_dataclass(ASPConfig, raw.get("asp_config"), "asp_config", problems),
        "async_config": parse_dataclass(AsyncConfig, raw.get("async_config"), "async_config", problems),
        "warmup_config": parse_dataclass(WarmupConfig, raw.get("warmup_config"), "warmup_config", problems),
        "msprobe_config": parse_dataclass(
            MsprobeConfig, raw.get("msprobe_config"), "msprobe_config", problems
        ),
        "rollout_correction": parse_dataclass(
            RolloutCorrectionSection, raw.get("rollout_correction"), "rollout_correction", problems
        ),
        "profiler_config": MappingProxyType(
            {
                str(role): parse_dataclass(ProfilerRoleConfig, r, f"profiler_config.{role}", problems)
                for role, r in profiler_raw.items()
            }
        ),
    }


def _refuse(
    raw: Mapping[str, Any],
    megatron: MegatronConfig,
    roles: Mapping[str, MegatronConfig | None],
    role_origins: Mapping[str, Mapping[str, str]],
    sections: Mapping[str, Any],
    problems: Problems,
) -> None:
    """Keys whose value asks for a feature this framework does not have (``refusals``)."""
    if raw.get("critic_config"):
        problems.add("critic_config", refusals.PPO_WITH_CRITIC)
    built = {"megatron_training": megatron, **{r: c for r, c in roles.items() if c is not None}}
    refusals.megatron_refusals(built, role_origins, _present(roles["actor_config"]), problems)
    for name in ("rl_config", "generate_config", "msprobe_config", "asp_config"):
        refusals.section_refusals(sections[name], name, problems)
    for role, section in sections["profiler_config"].items():
        refusals.section_refusals(section, f"profiler_config.{role}", problems)


def _section_inert_keys(raw: Mapping[str, Any], pipeline: str, megatron_engine: bool) -> list[Any]:
    engine: Engine = "megatron" if megatron_engine else "torch"
    found = inert.profiler_inert_keys(raw.get("profiler_config"), engine)
    for name, cls in (
        ("rl_config", RLConfig),
        ("generate_config", GenerateConfig),
        ("msprobe_config", MsprobeConfig),
    ):
        found += inert.section_inert_keys(cls, raw.get(name), name, engine)
    return found + inert.pipeline_inert_keys(raw, pipeline)


def _present(role: MegatronConfig | None) -> MegatronConfig:
    assert role is not None, "actor/ref roles are always built"
    return role
