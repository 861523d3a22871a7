"""Field helpers: every schema field carries its documentation (and, for keys with no effect here,
the reason) in dataclass metadata, so the dataclasses stay the one source of truth and tools such
as ``check_config`` can read the docs back.

Two kinds of "no effect" marker, because they are checked differently:

* ``inert``: no engine reads the key; the run-plan coverage test never asks for a read of it.
* ``inert_on_torch``: only the megatron engine reads it (``use_mcore_models: true``). The coverage
  test requires the plan to read it, and the loader lists it as inert only when the run trains
  on the torch engine (``inert.megatron_inert_keys``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

# runtime.config documents the control knobs it shares with AsyncConfig under this key.
from mindspeed_rl.runtime.config import DOC

INERT = "inert"
INERT_ON_TORCH = "inert_on_torch"

# Reasons reused by many keys; a per-key note is still attached to each field.
MEGATRON_ONLY = "Megatron/NPU only; the torch backend uses plain HF modules and ignores it"
PARALLEL_ONLY = "Megatron parallel layout; the torch backend trains one unsharded replica"
NPU_TOOL = "Ascend profiling/debug tooling; not available on the torch backend"


def _metadata(doc: str, inert: str | None, inert_on_torch: str | None) -> dict[str, str]:
    if inert is not None and inert_on_torch is not None:
        raise TypeError("a field is either inert everywhere or inert_on_torch, not both")
    meta = {DOC: doc}
    if inert is not None:
        meta[INERT] = inert
    if inert_on_torch is not None:
        meta[INERT_ON_TORCH] = inert_on_torch
    return meta


def opt(default: Any, doc: str, *, inert: str | None = None, inert_on_torch: str | None = None) -> Any:
    """A field with an immutable default, its documentation and an optional "no effect" reason."""
    return dataclasses.field(default=default, metadata=_metadata(doc, inert, inert_on_torch))


def section(factory: Any, doc: str, *, inert: str | None = None) -> Any:
    """A nested-section field (a dataclass default built by ``factory``); ``inert`` marks the
    whole section as having no effect (with the reason)."""
    return dataclasses.field(default_factory=factory, metadata=_metadata(doc, inert, None))


def field_doc(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get(DOC, ""))


def inert_reason(f: dataclasses.Field[Any]) -> str | None:
    """Why the key has no effect on any engine, or None when something reads it."""
    reason = f.metadata.get(INERT)
    return None if reason is None else str(reason)


def torch_inert_reason(f: dataclasses.Field[Any]) -> str | None:
    """Why the key has no effect on the torch engine, when only the megatron engine reads it."""
    reason = f.metadata.get(INERT_ON_TORCH)
    return None if reason is None else str(reason)
