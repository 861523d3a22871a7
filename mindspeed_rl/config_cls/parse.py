"""Typed parsing of plain YAML containers into frozen dataclasses.

The dataclass annotations are the schema: this module reads them (``typing.get_type_hints``) and
converts each user value into a new, immutable value. The input containers are only read, never
written. Problems are collected, not raised one at a time, so a user sees every mistake at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")


class ConfigError(ValueError):
    """One or more problems in a user's configuration (each message names the key and the fix)."""


@dataclasses.dataclass(slots=True)
class Problems:
    """Collects user-facing problems; ``raise_if_any`` turns them into one ``ConfigError``."""

    messages: list[str] = dataclasses.field(default_factory=list)

    def add(self, where: str, message: str) -> None:
        # Shared layers (architecture, megatron_training) are parsed once per role: report once.
        line = f"{where}: {message}"
        if line not in self.messages:
            self.messages.append(line)

    def raise_if_any(self) -> None:
        if self.messages:
            lines = "\n".join(f"  - {m}" for m in self.messages)
            raise ConfigError(f"invalid configuration ({len(self.messages)} problem(s)):\n{lines}")


class _Mismatch(Exception):
    """A value does not fit a type; carries the user-facing description."""


def field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def unknown_key_message(key: str, valid: Iterable[str]) -> str:
    """'unknown key' message naming the nearest valid key (difflib) and the fix."""
    valid = sorted(valid)
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return f"unknown key '{key}'; did you mean '{close[0]}'? (fix the spelling or remove the key)"
    nearest = difflib.get_close_matches(key, valid, n=3, cutoff=0.0)
    return f"unknown key '{key}' (nearest valid keys: {', '.join(nearest)}); remove it or fix the spelling"


def check_keys(raw: Mapping[str, Any], valid: Iterable[str], where: str, problems: Problems) -> None:
    valid_set = set(valid)
    for key in raw:
        if not isinstance(key, str):
            problems.add(where, f"keys must be strings, got {key!r}")
        elif key not in valid_set:
            problems.add(where, unknown_key_message(key, valid_set))


def parse_dataclass(cls: type[T], raw: Any, where: str, problems: Problems) -> T:
    """Parse one section. ``None`` (section absent or empty in YAML) gives all defaults."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        problems.add(where, f"expected a mapping of keys, got {_describe(raw)}")
        raw = {}
    check_keys(raw, field_names(cls), where, problems)
    return parse_fields(cls, raw, problems, lambda key: f"{where}.{key}")


def parse_fields(
    cls: type[T], raw: Mapping[str, Any], problems: Problems, where_of: Callable[[str], str]
) -> T:
    """Build ``cls`` from the keys of ``raw`` that are its fields (others are the caller's concern).

    A value that fails conversion is reported and left at its default, so parsing continues and
    the caller sees every problem before ``Problems.raise_if_any``.
    """
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in raw:
            continue
        try:
            values[f.name] = convert(raw[f.name], hints[f.name], where_of(f.name), problems)
        except _Mismatch as err:
            problems.add(where_of(f.name), str(err))
    return cls(**values)


def convert(value: Any, hint: Any, where: str, problems: Problems) -> Any:
    """Convert one YAML value to ``hint``; raises ``_Mismatch`` when it does not fit."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, Mapping):
            raise _Mismatch(f"expected a mapping, got {_describe(value)}")
        return parse_dataclass(hint, value, where, problems)
    if origin is Literal:
        options = typing.get_args(hint)
        if value not in options or isinstance(value, bool) != isinstance(options[0], bool):
            raise _Mismatch(f"expected one of {', '.join(map(repr, options))}, got {value!r}")
        return value
    if origin in (Union, types.UnionType):
        return _convert_union(value, typing.get_args(hint), where, problems)
    if origin is tuple:
        return _convert_tuple(value, typing.get_args(hint), where, problems)
    if origin in (Mapping, dict):
        return _convert_mapping(value, typing.get_args(hint), where, problems)
    return _convert_scalar(value, hint)


def _convert_union(value: Any, options: tuple[Any, ...], where: str, problems: Problems) -> Any:
    if value is None:
        if type(None) in options:
            return None
        raise _Mismatch("expected a value, got null")
    reasons = []
    for option in options:
        if option is type(None):
            continue
        try:
            return convert(value, option, where, problems)
        except _Mismatch as err:
            reasons.append(str(err))
    raise _Mismatch(" or ".join(reasons))


def _convert_tuple(value: Any, args: tuple[Any, ...], where: str, problems: Problems) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise _Mismatch(f"expected a list, got {_describe(value)}")
    item_hint = args[0]
    assert len(args) == 2 and args[1] is Ellipsis, "schema tuples must be tuple[X, ...]"
    return tuple(convert(item, item_hint, f"{where}[{i}]", problems) for i, item in enumerate(value))


def _convert_mapping(value: Any, args: tuple[Any, ...], where: str, problems: Problems) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Mismatch(f"expected a mapping, got {_describe(value)}")
    key_hint, item_hint = args
    out = {
        convert(k, key_hint, where, problems): convert(v, item_hint, f"{where}.{k}", problems)
        for k, v in value.items()
    }
    return types.MappingProxyType(out)


def _convert_scalar(value: Any, hint: Any) -> Any:
    # bool is a subclass of int in Python; YAML `true` must never pass as a number.
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch(f"expected true or false, got {_describe(value)}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        # YAML writes 2e6 as a float; accept it when it is a whole number.
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _Mismatch(f"expected an integer, got {_describe(value)}")
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch(f"expected a number, got {_describe(value)}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise _Mismatch(f"expected a string, got {_describe(value)} (quote it in YAML)")
    raise AssertionError(f"unsupported schema type {hint!r} at a config field")


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"{type(value).__name__} {value!r}"
