"""Load ``rl_config.tool_config_path``: upstream's tool YAML, unchanged.

Shape (upstream ``configs/tools/retool_config.yaml``)::

    tools:
      - class_name: "mindspeed_rl.tools.retool.ReTool"
        config: {sandbox_fusion_url: ..., default_timeout: 30, memory_limit_mb: 1024, ...}
        tool_schema: {type: function, function: {name: code_interpreter, description: ..., parameters: {...}}}

``class_name`` is imported and called as ``cls(config, tool_schema)``; upstream's class paths
resolve to ours because this package keeps upstream's module names.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mindspeed_rl.tools.base import Tool


@dataclass(frozen=True, slots=True)
class ToolEntry:
    """One entry of the tool YAML, checked but not yet built (it crosses to the actors)."""

    class_name: str
    config: Mapping[str, Any]
    tool_schema: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.tool_schema["function"]["name"])


def read_tool_config(path: str | Path) -> tuple[ToolEntry, ...]:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"rl_config.tool_config_path={str(path)!r} is not a file; point it at a tool YAML")
    raw = yaml.safe_load(file.read_text()) or {}
    tools = raw.get("tools") if isinstance(raw, dict) else None
    if not isinstance(tools, list) or not tools:
        raise ValueError(
            f"{path}: needs a non-empty 'tools:' list (class_name, config, tool_schema per tool)"
        )
    entries = []
    for i, item in enumerate(tools):
        where = f"{path}: tools[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("class_name"), str):
            raise ValueError(f"{where} needs a class_name string (e.g. mindspeed_rl.tools.retool.ReTool)")
        unknown = sorted(set(item) - {"class_name", "config", "tool_schema"})
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {unknown}; an entry has class_name, config, tool_schema"
            )
        schema = item.get("tool_schema")
        function = schema.get("function") if isinstance(schema, dict) else None
        if (
            not isinstance(schema, dict)
            or schema.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise ValueError(
                f"{where}: tool_schema must be an OpenAI function schema "
                "{type: function, function: {name: ..., description: ..., parameters: {...}}}"
            )
        config = item.get("config") or {}
        if not isinstance(config, dict):
            raise ValueError(f"{where}: config must be a mapping")
        entries.append(ToolEntry(class_name=item["class_name"], config=config, tool_schema=schema))
    names = [e.name for e in entries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path}: tool name(s) {duplicates} defined twice; names must be unique")
    return tuple(entries)


def build_tools(entries: tuple[ToolEntry, ...]) -> dict[str, Tool]:
    """Instantiate every tool, keyed by its function name."""
    tools: dict[str, Tool] = {}
    for entry in entries:
        module_name, _, class_name = entry.class_name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ValueError(
                f"tool class {entry.class_name!r} cannot be imported ({exc}); use a dotted path such as "
                "mindspeed_rl.tools.retool.ReTool"
            ) from exc
        tool = cls(dict(entry.config), dict(entry.tool_schema))
        if not isinstance(tool, Tool):
            raise ValueError(f"tool class {entry.class_name!r} does not implement name, schema and execute()")
        tools[entry.name] = tool
    return tools
