"""Tool-call parsers: turn the text of one model turn into the calls it makes.

A parser is a small class registered under the name ``rl_config.tool_parser_format`` uses
(``@register_parser("hermes")``), so another syntax plugs in without touching the agent loop; a
dotted ``module.Class`` path names one that is not registered (imported where it is used, as a
tool YAML's ``class_name`` is).
Parsing never raises on model output: a call that cannot be read becomes a ``CallError`` that the
agent loop answers with a tool response saying what was wrong, so the model can learn from it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One well-formed call: a tool name and its JSON-object arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CallError:
    """A call the parser found but could not read (shown to the model as the tool response)."""

    message: str


ParsedCall = ToolCall | CallError


class ToolParser(Protocol):
    """Finds tool calls in a turn's decoded text."""

    @property
    def close_marker(self) -> str:
        """Text that ends a call: the engine may stop decoding right after it."""
        ...

    def parse(self, text: str) -> list[ParsedCall]:
        """Every call in ``text``, in order; an empty list when the turn makes none."""
        ...


_PARSERS: dict[str, Callable[[], ToolParser]] = {}


def register_parser(name: str) -> Callable[[type], type]:
    """Class decorator: make a parser available as ``tool_parser_format: <name>``."""

    def decorate(cls: type) -> type:
        if name in _PARSERS:
            raise ValueError(f"tool parser {name!r} is registered twice")
        _PARSERS[name] = cls
        return cls

    return decorate


def parser_names() -> list[str]:
    return sorted(_PARSERS)


def get_parser(name: str) -> ToolParser:
    if name not in _PARSERS and "." in name:
        return _import_parser(name)
    if name not in _PARSERS:
        raise ValueError(
            f"rl_config.tool_parser_format={name!r} is not a known tool-call parser; use one of {parser_names()}"
        )
    return _PARSERS[name]()


def _import_parser(path: str) -> ToolParser:
    import importlib

    module_name, _, class_name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(
            f"rl_config.tool_parser_format={path!r}: cannot import it ({exc}); name a registered parser "
            f"({parser_names()}) or an importable module.Class"
        ) from exc
    try:
        parser = cls()
    except TypeError as exc:
        raise ValueError(
            f"rl_config.tool_parser_format={path!r}: a parser class is built without arguments ({exc})"
        ) from exc
    if not callable(getattr(parser, "parse", None)) or not isinstance(
        getattr(parser, "close_marker", None), str
    ):
        raise ValueError(
            f"rl_config.tool_parser_format={path!r} is not a tool parser: it needs parse(text) and a "
            "close_marker string"
        )
    return parser


@register_parser("hermes")
class HermesParser:
    """Hermes / Qwen2.5 syntax: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

    open_marker = "<tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    @property
    def close_marker(self) -> str:
        return "</tool_call>"

    def parse(self, text: str) -> list[ParsedCall]:
        calls: list[ParsedCall] = [_read_call(body) for body in self._CALL.findall(text)]
        # An opened call the turn never closed is still the model's attempt at a call: answer it
        # rather than pretend it was plain text.
        tail = text.rsplit(self.close_marker, 1)[-1]
        if self.open_marker in tail:
            calls.append(CallError(f"unterminated tool call: {self.open_marker} without {self.close_marker}"))
        return calls


def _read_call(body: str) -> ParsedCall:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        return CallError(f"tool call is not valid JSON ({exc.msg} at position {exc.pos})")
    if not isinstance(payload, dict):
        return CallError('tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return CallError('tool call has no "name" string')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        # Some models emit the arguments JSON-encoded a second time (OpenAI's wire format).
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return CallError(f'tool call {name!r}: "arguments" is a string that is not a JSON object')
    if not isinstance(arguments, dict):
        return CallError(f'tool call {name!r}: "arguments" must be a JSON object')
    return ToolCall(name=name, arguments=arguments)
