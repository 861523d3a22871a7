"""The tool protocol and the checks every tool call passes before it runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a call answered. ``ok`` False marks an error the model caused or met (bad arguments,
    a crash, a timeout): still a normal response the model sees, and counted in the metrics."""

    text: str
    ok: bool = True


@runtime_checkable
class Tool(Protocol):
    """A callable tool. ``schema`` is the OpenAI function schema from the tool config
    (``{"type": "function", "function": {"name", "description", "parameters"}}``)."""

    @property
    def name(self) -> str: ...

    @property
    def schema(self) -> Mapping[str, Any]: ...

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        """Run one call; must not raise for anything the arguments contain (return ok=False)."""
        ...


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def argument_error(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the function schema's parameters, or None when they do.

    Checks what a model gets wrong in practice (missing required names, unknown names when the
    schema lists its properties, wrong JSON types); not a full JSON-Schema validator."""
    function = schema.get("function", {})
    params = function.get("parameters", {}) or {}
    properties: Mapping[str, Any] = params.get("properties", {}) or {}
    name = function.get("name", "?")
    missing = [key for key in params.get("required", []) if key not in arguments]
    if missing:
        return f"tool {name!r} is missing required argument(s) {missing}"
    if properties:
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            return f"tool {name!r} has no argument(s) {unknown}; it takes {sorted(properties)}"
    for key, value in arguments.items():
        expected = properties.get(key, {}).get("type")
        types = _JSON_TYPES.get(expected) if isinstance(expected, str) else None
        # bool is an int in Python, but not a JSON integer/number.
        if types is not None and (
            not isinstance(value, types) or (isinstance(value, bool) and expected != "boolean")
        ):
            return f"tool {name!r}: argument {key!r} must be a JSON {expected}, got {type(value).__name__}"
    return None
