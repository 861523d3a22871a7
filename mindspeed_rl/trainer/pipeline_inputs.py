"""``PipelineInputs``: what one async run generates and trains on, as one record.

Production builds it from the config (``async_setup.asp_inputs``: the run's prompts in the ASP
order); a trace replay or a fault test builds its own in ``cli/`` and hands it to
``grpo_trainer_async.train``. Nothing below the trainer reads the environment for test hooks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mindspeed_rl.workers.fault_plan import FaultPlan

if TYPE_CHECKING:
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.runtime.records import ScheduledMinibatch


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineInputs:
    prompts: tuple[PromptRecord, ...]
    """Every prompt the run schedules, each consumed exactly once."""
    schedule: tuple[ScheduledMinibatch, ...]
    """The minibatches in dispatch order."""
    forced_lengths: Mapping[str, tuple[int, ...]] | None = None
    """Trace replay: each prompt's per-sample response lengths (EOS ignored)."""
    simulated_step_seconds: float | None = None
    """Trace replay: the trainer step is a fixed sleep of this many seconds."""
    held_out: tuple[PromptRecord, ...] = ()
    """The split's validation prompts, for periodic evaluation (never trained on)."""
    faults: FaultPlan = field(default_factory=FaultPlan)
    """Fault tests: which processes exit, and when."""
    checkpoint_commit_delay_s: float = 0.0
    """Crash tests: seconds each checkpoint write waits between its files and its commit."""

    def with_faults(self, faults: FaultPlan) -> PipelineInputs:
        from dataclasses import replace

        return replace(self, faults=faults)
