"""Field helpers: every schema field carries its documentation (and, for keys the torch backend
ignores, the reason) in dataclass metadata, so the dataclasses stay the one source of truth and
tools such as ``check_config`` can read the docs back."""

from __future__ import annotations

import dataclasses
from typing import Any

DOC = "doc"
INERT = "inert"

# Reasons reused by many keys; a per-key note is still attached to each field.
MEGATRON_ONLY = "Megatron/NPU only; the torch backend uses plain HF modules and ignores it"
PARALLEL_ONLY = "Megatron parallel layout; the torch backend trains one unsharded replica"
NPU_TOOL = "Ascend profiling/debug tooling; not available on the torch backend"


def opt(default: Any, doc: str, *, inert: str | None = None) -> Any:
    """A field with an immutable default, its documentation and an optional inert note."""
    meta: dict[str, str] = {DOC: doc}
    if inert is not None:
        meta[INERT] = inert
    return dataclasses.field(default=default, metadata=meta)


def section(factory: Any, doc: str, *, inert: str | None = None) -> Any:
    """A nested-section field (a dataclass default built by ``factory``); ``inert`` marks the
    whole section as having no effect (with the reason)."""
    meta: dict[str, str] = {DOC: doc}
    if inert is not None:
        meta[INERT] = inert
    return dataclasses.field(default_factory=factory, metadata=meta)


def field_doc(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get(DOC, ""))


def inert_reason(f: dataclasses.Field[Any]) -> str | None:
    reason = f.metadata.get(INERT)
    return None if reason is None else str(reason)
