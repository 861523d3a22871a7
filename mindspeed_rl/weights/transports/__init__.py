"""Weight transports: which medium carries a snapshot from the Training Unit to the Generation
Units. One module per transport, each exporting ``TRANSPORT`` (a ``base.Transport``); this file
is the one place a transport's name is turned into its code.

::

    async_config.weight_transport (config_cls.async_config.WeightTransport, the Literal)
        │ carried typed: AsyncSpec → GuSpec / TrainingUnit.enable_snapshots / MemorySnapshot.medium
        ▼
    transport_for(name) ─► shared_fs.TRANSPORT | object_store.TRANSPORT | collective.TRANSPORT
                              .exporter(...)     the TU's exporter
                              .gu_end(...)       the GU's convert / reload-handle end
                              .actor_reader(...) what an actor loads an in-memory snapshot with

No torch and no Ray at import: the plan and the Control Unit import this package; each transport
module imports its machinery inside its methods.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import get_args

from mindspeed_rl.config_cls.async_config import DEFAULT_WEIGHT_TRANSPORT, WeightTransport
from mindspeed_rl.weights.transports.base import Converted, DeltaSettings, GuEnd, Transport

_MODULES: dict[str, str] = {name: f"{__name__}.{name}" for name in get_args(WeightTransport)}
"""Each transport lives in the module of its name (one module per transport, nothing else)."""

__all__ = [
    "DEFAULT_WEIGHT_TRANSPORT",
    "Converted",
    "DeltaSettings",
    "GuEnd",
    "Transport",
    "WeightTransport",
    "transport_for",
]


@cache
def transport_for(name: str) -> Transport:
    """The transport named ``name`` (the schema already narrowed it; a hand-built spec with an
    unknown name is refused here, naming the key)."""
    module = _MODULES.get(name)
    if module is None:
        raise ValueError(
            f"async_config.weight_transport={name!r} is unknown; use one of {', '.join(_MODULES)}"
        )
    transport: Transport = importlib.import_module(module).TRANSPORT
    if transport.name != name:  # a module exporting another's TRANSPORT would be looked up wrong
        raise AssertionError(f"{module}.TRANSPORT is named {transport.name!r}, not {name!r}")
    return transport
