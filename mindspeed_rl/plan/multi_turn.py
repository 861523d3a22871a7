"""``rl_config``'s multi-turn keys -> ``MultiTurnSpec`` (or None), checked before any run work."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mindspeed_rl.contracts import MultiTurnSpec
from mindspeed_rl.tools.agent_loop import AgentSettings
from mindspeed_rl.tools.config import read_tool_config
from mindspeed_rl.tools.parsers import get_parser

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig

_TOOL_KEYS = (
    "tool_config_path",
    "max_tool_calls",
    "max_parallel_calls",
    "max_total_response_length",
    "max_tool_response_length",
    "tool_response_truncate_side",
    "tool_parser_format",
    "tool_call_timeout",
)


DEFAULT_CALL_TIMEOUT_S = 120.0
"""``tool_call_timeout: null``: generous for a code run (the sandbox's own timeout is shorter),
short enough that a hung tool costs one trajectory a bounded wait, not the run."""


def multi_turn_spec(config: GRPOConfig, max_tokens: int) -> MultiTurnSpec | None:
    rl = config.rl_config
    # Read every key whatever the switch: the plan is the one reader of each (test_build_coverage).
    values = {key: getattr(rl, key) for key in _TOOL_KEYS}
    if not rl.multi_turn_enable:
        # A tool key set without the switch would be ignored: say so rather than drop it.
        set_keys = [k for k, v in values.items() if v not in (None, 0)]
        if set_keys:
            raise ValueError(
                f"rl_config {set_keys} set but rl_config.multi_turn_enable is false; enable multi-turn "
                "rollouts or remove them"
            )
        return None
    if rl.pipeline == "async" and rl.partial_rollout_max_split > 1:
        raise ValueError(
            "rl_config.multi_turn_enable with partial rollouts (partial_rollout_max_split > 1) is not supported "
            "yet: a trajectory would cross weight refreshes between tool calls; set "
            "rl_config.partial_rollout_max_split: 1"
        )
    if rl.tool_config_path is None:
        raise ValueError(
            "rl_config.multi_turn_enable needs rl_config.tool_config_path (a tool YAML such as "
            "configs/tools/retool_config.yaml)"
        )
    parser = rl.tool_parser_format or "hermes"
    get_parser(parser)  # unknown names fail here, listing the registered ones
    settings = AgentSettings(
        max_tool_calls=rl.max_tool_calls,
        max_parallel_calls=rl.max_parallel_calls,
        max_total_response_length=rl.max_total_response_length or max_tokens,
        max_tool_response_length=rl.max_tool_response_length,
        truncate_side=rl.tool_response_truncate_side or "middle",
        call_timeout_s=DEFAULT_CALL_TIMEOUT_S if rl.tool_call_timeout is None else rl.tool_call_timeout,
    )
    limit = config.generate_config.max_model_len
    if limit is not None and rl.max_prompt_length + settings.max_total_response_length > limit:
        # Each turn's context is prompt + response so far; the last one would not fit the engine.
        raise ValueError(
            f"rl_config.max_prompt_length {rl.max_prompt_length} + max_total_response_length "
            f"{settings.max_total_response_length} > generate_config.max_model_len {limit}; lower one of "
            "the first two or raise max_model_len"
        )
    return MultiTurnSpec(settings=settings, parser=parser, tools=read_tool_config(rl.tool_config_path))
