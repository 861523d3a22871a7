"""Which schema fields a consumer reads: a recording proxy over a config and a schema walk.

``record_reads(config)`` wraps a frozen config so that every field read through it (nested
sections included, properties and methods resolved against the proxy) lands in a set of
``(class, field)`` pairs. ``unread_fields(GRPOConfig, reads)`` walks the schema and returns the
leaf fields neither read nor declared inert (``fields.opt(inert=...)``) nor refused
(``fields.opt(refused=...)``: the loader refuses every value that would ask for something): the
keys a user could set with no effect and no report. A field inert only on the torch engine
(``inert_on_torch``) is read by the megatron engine, so it must be read too. The run-plan coverage test runs ``build_run_plan``
through the proxy over configs that exercise every branch and requires that list to be empty.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Union

from mindspeed_rl.config_cls.fields import inert_reason, refusal

FieldRef = tuple[type, str]


class _Recording:
    """Read-only stand-in for a dataclass instance that records field reads."""

    __slots__ = ("_target", "_reads")

    def __init__(self, target: Any, reads: set[FieldRef]) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_reads", reads)

    def __getattr__(self, name: str) -> Any:
        target = object.__getattribute__(self, "_target")
        reads: set[FieldRef] = object.__getattribute__(self, "_reads")
        cls = type(target)
        if name in cls.__dataclass_fields__:
            reads.add((cls, name))
            return _wrap(getattr(target, name), reads)
        attr = inspect_class_attr(cls, name)
        if isinstance(attr, property) and attr.fget is not None:
            return attr.fget(self)  # the property's own field reads go through the proxy
        if isinstance(attr, types.FunctionType):
            return types.MethodType(attr, self)
        return getattr(target, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("configs are read-only")

    def __repr__(self) -> str:
        return f"Recording({object.__getattribute__(self, '_target')!r})"


class _RecordingMapping(Mapping[str, Any]):
    def __init__(self, target: Mapping[str, Any], reads: set[FieldRef]) -> None:
        self._target = target
        self._reads = reads

    def __getitem__(self, key: str) -> Any:
        return _wrap(self._target[key], self._reads)

    def __iter__(self) -> Iterator[str]:
        return iter(self._target)

    def __len__(self) -> int:
        return len(self._target)


def inspect_class_attr(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return None


def _wrap(value: Any, reads: set[FieldRef]) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _Recording(value, reads)
    if isinstance(value, Mapping):
        return _RecordingMapping(value, reads)
    return value


def record_reads(config: Any, reads: set[FieldRef]) -> Any:
    """``config`` behind a proxy adding every field read to ``reads``."""
    return _wrap(config, reads)


def schema_leaves(cls: type) -> list[tuple[str, type, str]]:
    """``(dotted path, class, field)`` of every non-section field reachable from ``cls``, skipping
    fields (and whole sections) marked inert or refused. Each (class, field) is listed once."""
    out: list[tuple[str, type, str]] = []
    seen: set[FieldRef] = set()
    _walk(cls, cls.__name__, out, seen)
    return out


def unread_fields(cls: type, reads: set[FieldRef]) -> list[str]:
    """Dotted paths of the schema's leaf fields that are neither read nor inert nor refused."""
    return [path for path, owner, name in schema_leaves(cls) if (owner, name) not in reads]


def _walk(cls: type, where: str, out: list[tuple[str, type, str]], seen: set[FieldRef]) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if (cls, f.name) in seen or inert_reason(f) is not None or refusal(f) is not None:
            continue
        seen.add((cls, f.name))
        nested = _section_type(hints[f.name])
        if nested is None:
            out.append((f"{where}.{f.name}", cls, f.name))
        else:
            _walk(nested, f"{where}.{f.name}", out, seen)


def _section_type(hint: Any) -> type | None:
    """The dataclass a field holds (directly, optionally, or as mapping values), else None."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _section_type(options[0]) if len(options) == 1 else None
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        return _section_type(typing.get_args(hint)[1])
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    return None
