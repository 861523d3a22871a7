"""``profiler_config`` and ``msprobe_config``: upstream's Ascend profiling and debug tools.

Accepted and typed for upstream compatibility; every key is inert on both training engines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mindspeed_rl.config_cls.fields import NPU_TOOL, opt


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfilerRoleConfig:
    """Profiler settings of one role (upstream keys them by role: integrated, actor, ref, ...)."""

    role: str | None = opt(
        None, "The role profiled (upstream fills it from the block's key).", inert=NPU_TOOL
    )
    profile: bool = opt(False, "Enable the profiler.", inert=NPU_TOOL)
    mstx: bool = opt(False, "mstx markers.", inert=NPU_TOOL)
    stage: str = opt("all", "Stages profiled.", inert=NPU_TOOL)
    profile_save_path: str = opt("./profiler_data", "Output folder.", inert=NPU_TOOL)
    profile_export_type: str = opt("text", "Export format.", inert=NPU_TOOL)
    profile_step_start: int = opt(1, "First profiled step.", inert=NPU_TOOL)
    profile_step_end: int = opt(2, "Last profiled step.", inert=NPU_TOOL)
    profile_level: str = opt("level0", "Detail level.", inert=NPU_TOOL)
    profile_with_memory: bool = opt(False, "Record memory.", inert=NPU_TOOL)
    profile_record_shapes: bool = opt(False, "Record shapes.", inert=NPU_TOOL)
    profile_with_cpu: bool = opt(True, "Record CPU.", inert=NPU_TOOL)
    profile_with_npu: bool = opt(True, "Record NPU.", inert=NPU_TOOL)
    profile_with_module: bool = opt(False, "Record module stacks.", inert=NPU_TOOL)
    profile_analysis: bool = opt(False, "Analyse after run.", inert=NPU_TOOL)
    profile_ranks: str | tuple[int, ...] = opt("all", "Ranks profiled (all or a list).", inert=NPU_TOOL)


ProfilerConfig = Mapping[str, ProfilerRoleConfig]


@dataclass(frozen=True, slots=True, kw_only=True)
class MsprobeConfig:
    """Ascend msprobe precision-debugging dumps."""

    msprobe: bool = opt(False, "Enable msprobe.", inert=NPU_TOOL)
    dump_path: str = opt("./msprobe_dump", "Dump folder.", inert=NPU_TOOL)
    key_data_dump: bool = opt(False, "Dump key data.", inert=NPU_TOOL)
    configurations_dump: bool = opt(False, "Dump configurations.", inert=NPU_TOOL)
    actor_train_dump: bool = opt(False, "Dump actor training.", inert=NPU_TOOL)
    actor_infer_dump: bool = opt(False, "Dump actor inference.", inert=NPU_TOOL)
    reference_dump: bool = opt(False, "Dump reference pass.", inert=NPU_TOOL)
    critic_train_dump: bool = opt(False, "Dump critic training.", inert=NPU_TOOL)
    role: str | None = opt(None, "The role dumped (upstream fills it in).", inert=NPU_TOOL)
    step_start: int = opt(0, "First dumped step.", inert=NPU_TOOL)
    step_end: int = opt(0, "Last dumped step.", inert=NPU_TOOL)
    token_range_start: int = opt(0, "First dumped token.", inert=NPU_TOOL)
    token_range_end: int = opt(0, "Last dumped token.", inert=NPU_TOOL)
