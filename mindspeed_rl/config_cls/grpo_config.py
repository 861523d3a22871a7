"""``GRPOConfig``: the whole typed, frozen configuration of one run."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mindspeed_rl.config_cls.asp_config import ASPConfig
from mindspeed_rl.config_cls.async_config import AsyncConfig
from mindspeed_rl.config_cls.generate_config import GenerateConfig
from mindspeed_rl.config_cls.megatron_config import MegatronConfig
from mindspeed_rl.config_cls.model_arch import ModelArchitecture
from mindspeed_rl.config_cls.rl_config import RLConfig
from mindspeed_rl.config_cls.rollout_correction import RolloutCorrectionSection
from mindspeed_rl.config_cls.tool_configs import MsprobeConfig, ProfilerRoleConfig
from mindspeed_rl.config_cls.warmup_config import WarmupConfig
from mindspeed_rl.runtime.config import RuntimeConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class InertKey:
    """A key the user set that has no effect on the torch backend / the chosen pipeline."""

    section: str
    key: str
    reason: str

    def __str__(self) -> str:
        return f"{self.section}.{self.key}: {self.reason}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GRPOConfig:
    """Resolved configuration. Role sections (``megatron_training``, ``actor_config``,
    ``ref_config``, ``reward_config``, ``critic_config``) are already merged as upstream does:
    architecture < megatron_training < role section."""

    model_name: str
    """Architecture name from the `model:` group ("" when arch keys were written inline)."""
    megatron_training: MegatronConfig
    """Architecture < megatron_training (the run-level keys; data, batch size, iterations)."""
    actor_config: MegatronConfig
    """Architecture < megatron_training < actor_config: what the actor trains with."""
    ref_config: MegatronConfig
    """Architecture < megatron_training < ref_config (ref_config may be absent)."""
    reward_config: MegatronConfig | None
    """Reward-model role, only when the YAML has a reward_config section."""
    critic_config: MegatronConfig | None
    """Critic role, only when the YAML has a critic_config section (unused by GRPO)."""
    rl_config: RLConfig
    generate_config: GenerateConfig
    asp_config: ASPConfig
    async_config: AsyncConfig
    warmup_config: WarmupConfig
    profiler_config: Mapping[str, ProfilerRoleConfig]
    msprobe_config: MsprobeConfig
    rollout_correction: RolloutCorrectionSection = dataclasses.field(default_factory=RolloutCorrectionSection)
    """Off-policy correction of the policy loss (all null: today's loss)."""
    run_dir: str = "runs"
    """Root folder of run directories (a run writes <run_dir>/<timestamp>_<config-name>/)."""
    inert_keys: tuple[InertKey, ...] = dataclasses.field(default=(), compare=False)
    """Keys the user set that have no effect here (reported, never silently dropped)."""

    @property
    def model(self) -> ModelArchitecture:
        return self.actor_config.arch

    @property
    def num_prompts_per_global_batch(self) -> int:
        return self.megatron_training.training.global_batch_size

    @property
    def num_prompts_per_step(self) -> int:
        """Prompts one trainer step (iteration) trains: with DAPO's dynamic sampling upstream's
        ``filter_groups_train_batch_size`` kept prompts, drawn from generation batches of
        ``global_batch_size``; otherwise the global batch itself."""
        rl = self.rl_config
        return (
            rl.filter_groups_train_batch_size
            if rl.filter_groups_enable
            else self.num_prompts_per_global_batch
        )

    @property
    def global_batch_samples(self) -> int:
        return self.num_prompts_per_global_batch * self.rl_config.n_samples_per_prompt

    @property
    def mini_batch_prompts(self) -> int:
        return self.rl_config.mini_batch_prompts(self.num_prompts_per_step)

    def runtime_config(self) -> RuntimeConfig:
        """The Control Unit's settings: ``async_config``'s knobs counted against one trainer step's
        batch (``num_prompts_per_step``).
        Building it runs the queue, backpressure and lag rules; the loader builds it for an async
        run, so a loaded config never fails here."""
        return RuntimeConfig.from_knobs(
            self.async_config,
            num_prompts_per_global_batch=self.num_prompts_per_step,
            num_samples_per_prompt=self.rl_config.n_samples_per_prompt,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict in the YAML's own shape; ``load_config`` accepts it back unchanged."""
        out: dict[str, Any] = {
            "run_dir": self.run_dir,
            "model": {self.model_name: _jsonable(self.megatron_training.arch)} if self.model_name else {},
        }
        for f in dataclasses.fields(self):
            if f.name in ("model_name", "run_dir", "inert_keys"):
                continue
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = _jsonable(value)
        return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, MegatronConfig):
        return {k: _jsonable(v) for k, v in value.to_flat_dict().items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value
