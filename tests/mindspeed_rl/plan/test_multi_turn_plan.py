"""rl_config's multi-turn keys: accepted with the HF engine, checked, and carried to the actors."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.tools.config import build_tools, read_tool_config
from mindspeed_rl.tools.retool import ReTool

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"
TOOLS = CONFIGS / "tools" / "retool_config.yaml"
MULTI_TURN = (
    "rl_config.rollout_backend=hf",
    "++rl_config.multi_turn_enable=true",
    f"++rl_config.tool_config_path={TOOLS}",
    "++rl_config.max_tool_calls=2",
    "++rl_config.max_parallel_calls=1",
    "++rl_config.max_tool_response_length=64",
    "++rl_config.tool_response_truncate_side=left",
    "++rl_config.tool_parser_format=hermes",
)


def plan(*overrides: str):  # type: ignore[no-untyped-def]
    return build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_asp", overrides))


def test_multi_turn_keys_reach_the_rollout_spec() -> None:
    spec = plan(*MULTI_TURN, "++rl_config.max_total_response_length=48").rollout.multi_turn
    assert spec is not None and spec.parser == "hermes"
    s = spec.settings
    assert (s.max_tool_calls, s.max_parallel_calls, s.max_tool_response_length) == (2, 1, 64)
    assert (s.truncate_side, s.max_total_response_length) == ("left", 48)
    assert [t.name for t in spec.tools] == ["code_interpreter"]
    assert spec.tools[0].class_name == "mindspeed_rl.tools.retool.ReTool"


def test_upstream_defaults_fill_the_unset_keys() -> None:
    spec = plan(
        "rl_config.rollout_backend=hf",
        "++rl_config.multi_turn_enable=true",
        f"++rl_config.tool_config_path={TOOLS}",
        "++rl_config.max_tool_calls=1",
        "++rl_config.max_parallel_calls=1",
    ).rollout.multi_turn
    assert spec is not None and spec.parser == "hermes" and spec.settings.truncate_side == "middle"
    # 0 = the response cap of sampling_config.max_tokens (32 in grpo_tiny_asp).
    assert spec.settings.max_total_response_length == 32


def test_off_by_default() -> None:
    assert plan().rollout.multi_turn is None


@pytest.mark.parametrize(
    ("overrides", "phrase"),
    [
        (("++rl_config.max_tool_calls=2",), "multi_turn_enable is false"),
        (
            ("rl_config.rollout_backend=hf", "++rl_config.multi_turn_enable=true"),
            "needs rl_config.tool_config_path",
        ),
        ((*MULTI_TURN, "++rl_config.max_parallel_calls=0"), "max_parallel_calls=0 must be >= 1"),
        ((*MULTI_TURN, "++rl_config.tool_parser_format=xml"), "not a known tool-call parser"),
        ((*MULTI_TURN, "++rl_config.tool_config_path=/nope.yaml"), "is not a file"),
        (
            (*MULTI_TURN, "++rl_config.max_total_response_length=100000"),
            "max_total_response_length 100000 > generate_config.max_model_len",
        ),
    ],
)
def test_bad_multi_turn_settings_name_the_fix(overrides: tuple[str, ...], phrase: str) -> None:
    with pytest.raises(ValueError, match=phrase):
        plan(*overrides)


def test_vllm_backend_is_accepted_and_partial_rollouts_are_refused_by_name() -> None:
    assert plan(*MULTI_TURN, "rl_config.rollout_backend=vllm").rollout.multi_turn is not None
    with pytest.raises(ValueError, match="set rl_config.partial_rollout_max_split: 1"):
        plan(*MULTI_TURN, "++rl_config.partial_rollout_max_split=2")


def test_shipped_tool_yaml_builds_upstreams_class(tmp_path: Path) -> None:
    entries = read_tool_config(TOOLS)
    # The local sandbox refuses to start without network isolation unless told; opt out here so
    # the build itself is what is tested on any machine.
    config = {**entries[0].config, "isolate_network": False}
    tools = build_tools((type(entries[0])(entries[0].class_name, config, entries[0].tool_schema),))
    assert isinstance(tools["code_interpreter"], ReTool)


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("tools: []", "non-empty 'tools:' list"),
        ("tools:\n  - config: {}\n", "needs a class_name"),
        ("tools:\n  - class_name: a.B\n    tool_schema: {type: function}\n", "OpenAI function schema"),
        ("tools:\n  - class_name: a.B\n    extra: 1\n", "unknown key"),
    ],
)
def test_bad_tool_yaml_names_the_problem(tmp_path: Path, text: str, phrase: str) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=phrase):
        read_tool_config(path)


def test_unknown_tool_class_names_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n  - class_name: mindspeed_rl.tools.nope.Tool\n"
        "    tool_schema: {type: function, function: {name: t}}\n"
    )
    with pytest.raises(ValueError, match="cannot be imported"):
        build_tools(read_tool_config(path))
