"""Field helpers: every schema field carries its documentation (and, for keys with no effect here,
the reason) in dataclass metadata, so the dataclasses stay the one source of truth and tools such
as ``check_config`` can read the docs back.

Two kinds of "no effect" marker, because they are checked differently:

* ``inert``: no engine reads the key; the run-plan coverage test never asks for a read of it.
  The reason is one sentence true on both training engines, or a ``ByEngine`` pair when the
  engines ignore the key for different reasons: a megatron user told "the torch backend ignores
  it" reads a bug, so ``inert_reason(f, engine)`` gives the reason of the engine that runs.
* ``inert_on_torch``: only the megatron engine reads it (``use_mcore_models: true``). The coverage
  test requires the plan to read it, and the loader lists it as inert only when the run trains
  on the torch engine (``inert.megatron_inert_keys``).

And one "asks for a feature this framework does not have" marker:

* ``refused``: the feature, named for the user, and what to do instead. The loader refuses any
  value other than the default and the ``accepts`` values (``refusals.py``), naming section.key
  and that feature; the default and the accepted values ask for nothing the engines do not already
  do, so the coverage test needs no read of a refused field. ``accepts`` is a tuple of values, or
  a predicate ``(value, siblings) -> bool`` when acceptance depends on other keys (``siblings``:
  the actor role's resolved Megatron keys for a Megatron key, else the section holding the field).
  A refused field may be ``inert`` too: the reason then covers its accepted values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

# runtime.config documents the control knobs it shares with AsyncConfig under this key.
from mindspeed_rl.runtime.config import DOC

INERT = "inert"
INERT_ON_TORCH = "inert_on_torch"
REFUSED = "refused"
ACCEPTS = "accepts"

Engine = Literal["torch", "megatron"]
ENGINES: tuple[Engine, ...] = ("torch", "megatron")


@dataclass(frozen=True, slots=True)
class ByEngine:
    """Why an inert key has no effect, per training engine (``use_mcore_models`` picks one)."""

    torch: str
    megatron: str

    def __str__(self) -> str:
        return f"torch engine: {self.torch}; megatron engine: {self.megatron}"


# Reasons reused by many keys; a per-key note is still attached to each field. The first two are
# torch-engine reasons of keys the megatron engine reads (``inert_on_torch``).
MEGATRON_ONLY = "Megatron/NPU only; the torch backend uses plain HF modules and ignores it"
PARALLEL_ONLY = "Megatron parallel layout; the torch backend trains one unsharded replica"
TORCH_HF = "the torch engine trains plain HF modules, which have no such switch"
TORCH_ONE_REPLICA = "the torch engine trains one unsharded replica"
NPU_TOOL = "upstream's Ascend profiling/debug tooling; neither training engine calls it"


def megatron_reason(megatron: str, torch: str = TORCH_HF) -> ByEngine:
    """The reasons of a Megatron/MindSpeed switch that neither engine reads: ``torch`` (by default,
    HF modules have no such switch) and what the megatron engine does instead."""
    return ByEngine(torch=torch, megatron=megatron)


InertReason = str | ByEngine


Accepts = tuple[Any, ...] | Callable[[Any, Any], bool]


def _metadata(
    doc: str,
    inert: InertReason | None,
    inert_on_torch: str | None,
    refused: str | None = None,
    accepts: Accepts = (),
) -> dict[str, Any]:
    if inert is not None and inert_on_torch is not None:
        raise TypeError("a field is either inert everywhere or inert_on_torch, not both")
    if refused is not None and inert_on_torch is not None:
        # inert_on_torch means the megatron engine reads the key; a refused key is read by nobody.
        raise TypeError("a refused field is read by no engine, so it cannot be inert_on_torch")
    if accepts and refused is None:
        raise TypeError("accepts only qualifies refused=")
    meta: dict[str, Any] = {DOC: doc}
    if inert is not None:
        meta[INERT] = inert
    if inert_on_torch is not None:
        meta[INERT_ON_TORCH] = inert_on_torch
    if refused is not None:
        meta[REFUSED] = refused
        meta[ACCEPTS] = accepts
    return meta


def opt(
    default: Any,
    doc: str,
    *,
    inert: InertReason | None = None,
    inert_on_torch: str | None = None,
    refused: str | None = None,
    accepts: Accepts = (),
) -> Any:
    """A field with an immutable default, its documentation and optional "no effect" / "refused"
    markers (see the module docstring)."""
    return dataclasses.field(
        default=default, metadata=_metadata(doc, inert, inert_on_torch, refused, accepts)
    )


def section(factory: Any, doc: str, *, inert: str | None = None, refused: str | None = None) -> Any:
    """A nested-section field (a dataclass default built by ``factory``); ``inert`` marks the
    whole section as having no effect (with the reason), ``refused`` refuses any section that
    differs from the default one."""
    return dataclasses.field(default_factory=factory, metadata=_metadata(doc, inert, None, refused))


def field_doc(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get(DOC, ""))


def inert_reason(f: dataclasses.Field[Any], engine: Engine | None = None) -> str | None:
    """Why the key has no effect on any engine, or None when something reads it: the reason on
    ``engine`` when given, else both engines' reasons."""
    reason = f.metadata.get(INERT)
    if reason is None:
        return None
    if isinstance(reason, ByEngine) and engine is not None:
        return reason.torch if engine == "torch" else reason.megatron
    return str(reason)


def inert_reasons(f: dataclasses.Field[Any]) -> InertReason | None:
    """The inert marker as declared: one reason for both engines, or a ``ByEngine`` pair."""
    reason = f.metadata.get(INERT)
    return reason if reason is None or isinstance(reason, ByEngine) else str(reason)


def torch_inert_reason(f: dataclasses.Field[Any]) -> str | None:
    """Why the key has no effect on the torch engine, when only the megatron engine reads it."""
    reason = f.metadata.get(INERT_ON_TORCH)
    return None if reason is None else str(reason)


def refusal(f: dataclasses.Field[Any]) -> str | None:
    """The unsupported feature a non-default value asks for (and the fix), or None."""
    reason = f.metadata.get(REFUSED)
    return None if reason is None else str(reason)


def accepted(f: dataclasses.Field[Any], value: Any, siblings: Any) -> bool:
    """Whether ``value`` of a refused field asks for nothing new: the default, or an accepted value."""
    if value == field_default(f):
        return True
    accepts = f.metadata.get(ACCEPTS, ())
    return bool(accepts(value, siblings)) if callable(accepts) else value in accepts


def field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default
