"""What a Generation Unit is built from (``GuSpec``) and what its conversion thread hands back
(``ConversionDone``): plain records, kept apart from the GU's control loop."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mindspeed_rl.config_cls.async_config import DEFAULT_WEIGHT_TRANSPORT, WeightTransport
from mindspeed_rl.workers.fault_plan import FaultPlan

if TYPE_CHECKING:
    from mindspeed_rl.contracts import RolloutSpec
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.weights.transports.base import DeltaSettings
    from mindspeed_rl.workers.forced_lengths import LengthPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class GuSpec:
    """Everything a GU needs to start its actors."""

    gu_id: int
    rollout: RolloutSpec
    """The generation actors' engine and sampling settings (``RunPlan.rollout``)."""
    policy_path: str
    prompts: Mapping[str, PromptRecord]
    num_actors: int
    actor_options: Mapping[str, Any]
    actor_num_cpus: float
    cache_dir: str
    seed: int
    poll_wait_seconds: float = 1.0
    """Longest a long-poll waits without news. Only a safety net: the CU answers as soon as
    anything this GU acts on changes, so a shorter wait would only add idle round trips."""
    completion_hold_seconds: float = 0.1
    """Longest a finished minibatch waits to ride with its actor's next start request while that
    actor reloads first (30-60 ms in the CPU demo): one CU call instead of two. A slower reload
    (large models) sends the completion on its own once this has passed."""
    faults: FaultPlan = field(default_factory=FaultPlan)
    forced_lengths: Mapping[str, tuple[int, ...]] | LengthPlan | None = None
    """Trace replay only: each prompt's per-sample response lengths (see GenerationActor)."""
    per_actor_options: tuple[Mapping[str, Any], ...] = ()
    """Actor ``a``'s options (its placement-group bundle: ``ray_setup.ReservedPlacement``);
    empty = ``actor_options`` for every actor."""
    weight_transport: WeightTransport = DEFAULT_WEIGHT_TRANSPORT
    """How snapshots reach this GU (``weights/transports/``)."""
    weight_delta: DeltaSettings | None = None
    """``weight_delta`` auto / on: this GU applies deltas to its host copy (None: off)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversionDone:
    """What ``GenerationUnit.convert_snapshot`` hands back to the control loop."""

    version: int
    path: str | None
    """The converted copy; ``None`` if the snapshot was rejected (actors keep their weights)."""
    seconds: float
    delta: Mapping[str, float] | None = None
    """``weight_delta`` auto / on: the refresh's figures (bytes, changed fraction, seconds)."""
