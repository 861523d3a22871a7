"""Typed configuration: upstream MindSpeed-RL sections plus the ASP/async additions.

The dataclasses in this package are the schema; Hydra only loads and composes the YAML. This
package imports no torch/ray/vllm, and no omegaconf/hydra either until a YAML is loaded: the
loader's three functions are resolved on first use (``__getattr__`` below), so code that only needs
the schema (the weight transports on a device host without omegaconf) imports it.
"""

from typing import TYPE_CHECKING, Any

from mindspeed_rl.config_cls.asp_config import ASPConfig, PredictorConfig
from mindspeed_rl.config_cls.async_config import AsyncConfig
from mindspeed_rl.config_cls.generate_config import GenerateConfig, SamplingConfig
from mindspeed_rl.config_cls.grpo_config import GRPOConfig, InertKey
from mindspeed_rl.config_cls.megatron_config import MegatronConfig, OptimizerKeys, TrainingKeys
from mindspeed_rl.config_cls.megatron_only import MegatronOnlyKeys, ParallelKeys
from mindspeed_rl.config_cls.model_arch import ModelArchitecture
from mindspeed_rl.config_cls.parse import ConfigError
from mindspeed_rl.config_cls.resources import ActorResources
from mindspeed_rl.config_cls.rl_config import RLConfig
from mindspeed_rl.config_cls.tool_configs import MsprobeConfig, ProfilerRoleConfig
from mindspeed_rl.config_cls.warmup_config import WarmupConfig

if TYPE_CHECKING:
    from mindspeed_rl.config_cls.loader import compose_config, load_config, load_config_from_files

_LOADER = ("compose_config", "load_config", "load_config_from_files")


def __getattr__(name: str) -> Any:
    if name in _LOADER:
        from mindspeed_rl.config_cls import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ASPConfig",
    "ActorResources",
    "AsyncConfig",
    "ConfigError",
    "GRPOConfig",
    "GenerateConfig",
    "InertKey",
    "MegatronConfig",
    "MegatronOnlyKeys",
    "ModelArchitecture",
    "MsprobeConfig",
    "OptimizerKeys",
    "ParallelKeys",
    "PredictorConfig",
    "ProfilerRoleConfig",
    "RLConfig",
    "SamplingConfig",
    "TrainingKeys",
    "WarmupConfig",
    "compose_config",
    "load_config",
    "load_config_from_files",
]
