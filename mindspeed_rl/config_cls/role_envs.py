"""``async_config.role_envs``: one Python environment per role of the async pipeline.

::

    async_config:
      role_envs:
        trainer: {python: /opt/envs/trainer/bin/python}   # MindSpeed, megatron-core 0.12.1, torch 2.7.1
        rollout: {python: /opt/envs/rollout/bin/python}   # vllm-ascend, its vLLM and torch

Null (the default) = every actor in the environment Ray was started from, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mindspeed_rl.config_cls.fields import opt, section


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleEnvConfig:
    """The environment of one role's Ray actors."""

    python: str | None = opt(
        None,
        "Interpreter of the role's environment (a venv's or conda env's bin/python), the same path "
        "on every node; Ray starts the role's actors with it (runtime_env py_executable). Null = "
        "the environment Ray was started from.",
    )
    env_vars: Mapping[str, str] | None = opt(
        None,
        "Extra environment variables of the role's actors (over configs/envs/runtime_env.yaml's), "
        'e.g. {PYTHONPATH: /opt/mindspeed-rl}; "${VAR}" expands as in Ray\'s runtime_env.',
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleEnvsConfig:
    """The Training Unit's ranks (``trainer``) and the Generation Units with their generation
    actors (``rollout``); the driver and the Control Unit stay in the environment Ray was started
    from. The only thing the two roles exchange is the snapshot format (weights/format.py)."""

    trainer: RoleEnvConfig = section(RoleEnvConfig, "The Training Unit's environment (its ranks).")
    rollout: RoleEnvConfig = section(
        RoleEnvConfig, "The Generation Units' environment (their control processes and actors)."
    )
