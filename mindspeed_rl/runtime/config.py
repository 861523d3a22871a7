"""Settings of the asynchronous pipeline's control logic.

``ControlKnobs`` holds the ``async_config`` keys the control logic reads, each with its one
default and its documentation; the YAML schema (``config_cls.AsyncConfig``) and the Control
Unit's settings (``RuntimeConfig``) both extend it, so neither restates a knob. The rules over the
knobs live in ``RuntimeConfig`` alone: the config loader builds one, so a config passes load
exactly when the Control Unit accepts it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mindspeed_rl.runtime.minibatch_deadline import DeadlineSettings

DOC = "doc"
"""Field-metadata key of a knob's user-facing documentation. This package imports nothing else of
``mindspeed_rl``, so the schema's field helpers (``config_cls.fields``) take the key from here."""


def _knob(default: Any, doc: str) -> Any:
    return dataclasses.field(default=default, metadata={DOC: doc})


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlKnobs:
    """Queues, backpressure, the lag bound and fault handling. Units are stated per key."""

    gu_queue_low: int = _knob(
        5,
        "MINIBATCHES: refill a GU's input queue once it holds this many not-yet-started ones or fewer "
        "(paper: 5-10).",
    )
    gu_queue_high: int = _knob(
        10,
        "MINIBATCHES: fill a GU's input queue up to this (exceeded by less than one batch group, as "
        "batch groups are dispatched whole).",
    )
    queue_max_samples: int = _knob(
        512, "SAMPLES (Q_max): above this the Training Queue pauses GUs from starting minibatches."
    )
    queue_resume_samples: int = _knob(
        256,
        "SAMPLES: generation resumes once the queue drains to this or fewer; below queue_max_samples, "
        "the gap is the hysteresis that stops the pause signal flapping on every arrival.",
    )
    snapshot_interval: int = _knob(
        1,
        "Training steps between weight snapshots; actors can be up to snapshot_interval - 1 versions "
        "behind right after a reload, which max_policy_lag must leave room for.",
    )
    max_policy_lag: int | None = _knob(
        4,
        "Hard cap on d_off = (trainer version - sample's policy version) at consumption; null switches "
        "the bound off (backpressure alone limits staleness, as in the paper).",
    )
    minibatch_timeout_s: float | None = _knob(
        None,
        "SECONDS one minibatch may generate, fixed; past it the GU kills the actor, re-issues the "
        "minibatch and starts a replacement (counted as minibatches_timed_out). null = derived from "
        "the run (minibatch_timeout_factor).",
    )
    minibatch_timeout_factor: float | None = _knob(
        8.0,
        "With minibatch_timeout_s null: a minibatch may take this many times its expected duration "
        "(its predicted tokens at the slowest seconds-per-token its GU measured recently), at least "
        "minibatch_timeout_floor_s; null (with minibatch_timeout_s null) = no timeout, a hung engine "
        "is then caught only by stall_timeout_s, which fails the run.",
    )
    minibatch_timeout_floor_s: float = _knob(60.0, "SECONDS: the least a derived timeout allows.")
    minibatch_timeout_warmup_s: float = _knob(
        600.0,
        "SECONDS: the derived timeout until a GU has measured a few minibatches (engine warm-up, "
        "graph capture); derived timeouts stay below 0.8 x stall_timeout_s.",
    )
    actor_max_restarts: int = _knob(
        3,
        "Replacements per actor slot after it raised, timed out or died; then the slot is retired and "
        "its GU carries on with the actors it has left.",
    )
    minibatch_max_attempts: int = _knob(
        3,
        "Failed attempts (error, timeout, death) after which a minibatch is poison: the run stops "
        "naming it and its prompts.",
    )
    stall_timeout_s: float | None = _knob(
        900.0,
        "SECONDS without progress (completion, popped batch, trained step, snapshot) after which "
        "the run fails naming the stuck unit and the reason; must exceed minibatch_timeout_s; null = off.",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeConfig(ControlKnobs):
    """The knobs plus the batch they are counted against. Construction checks every rule over them;
    ``check_minibatch_fits`` adds the one that needs the schedule's minibatch sizes."""

    num_prompts_per_global_batch: int
    """Prompts consumed by one trainer step (batch sizes are counted in prompts)."""

    num_samples_per_prompt: int
    """Responses generated per prompt (GRPO's ``n``); all of them travel together."""

    @classmethod
    def from_knobs(
        cls, knobs: ControlKnobs, *, num_prompts_per_global_batch: int, num_samples_per_prompt: int
    ) -> RuntimeConfig:
        """``knobs`` (an ``async_config`` section, or any ``ControlKnobs``) for this batch."""
        values = {f.name: getattr(knobs, f.name) for f in dataclasses.fields(ControlKnobs)}
        return cls(
            num_prompts_per_global_batch=num_prompts_per_global_batch,
            num_samples_per_prompt=num_samples_per_prompt,
            **values,
        )

    def __post_init__(self) -> None:
        self._check_fault_settings()
        for name in ("num_prompts_per_global_batch", "num_samples_per_prompt", "gu_queue_high"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.snapshot_interval < 1:
            raise ValueError(f"snapshot_interval must be >= 1, got {self.snapshot_interval}.")
        if not 0 <= self.gu_queue_low < self.gu_queue_high:
            raise ValueError(
                f"need 0 <= gu_queue_low < gu_queue_high, got low={self.gu_queue_low}, "
                f"high={self.gu_queue_high}; the paper uses low=5, high=10."
            )
        if not 0 <= self.queue_resume_samples < self.queue_max_samples:
            raise ValueError(
                f"need 0 <= queue_resume_samples < queue_max_samples, got resume={self.queue_resume_samples}, "
                f"max={self.queue_max_samples}; set the resume level below Q_max."
            )
        if self.queue_max_samples < self.samples_per_global_batch:
            raise ValueError(
                f"queue_max_samples={self.queue_max_samples} is smaller than one global batch "
                f"({self.samples_per_global_batch} samples), so backpressure could pause generation before "
                f"the trainer has a batch to consume; raise queue_max_samples to >= {self.samples_per_global_batch}."
            )
        short_batch = self.samples_per_global_batch - self.num_samples_per_prompt
        if self.queue_resume_samples < short_batch:
            # A queue one prompt short of a global batch cannot be consumed; if that is still
            # above the resume level, generation and training would wait for each other forever.
            raise ValueError(
                f"queue_resume_samples={self.queue_resume_samples} is below {short_batch} samples (a global "
                "batch minus one prompt), which can deadlock a paused pipeline; raise queue_resume_samples."
            )
        if self.max_policy_lag is not None and self.max_policy_lag < self.snapshot_interval - 1:
            raise ValueError(
                f"max_policy_lag={self.max_policy_lag} is below snapshot_interval - 1 = "
                f"{self.snapshot_interval - 1}: freshly reloaded actors would already be too stale; "
                "raise max_policy_lag or export snapshots more often."
            )

    def _check_fault_settings(self) -> None:
        for name in ("minibatch_timeout_s", "stall_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"async_config.{name} must be > 0 seconds or null (off), got {value}.")
        if self.actor_max_restarts < 0 or self.minibatch_max_attempts < 1:
            raise ValueError(
                f"need actor_max_restarts >= 0 and minibatch_max_attempts >= 1, got "
                f"{self.actor_max_restarts} and {self.minibatch_max_attempts}."
            )
        self.deadline_settings()  # the derived-timeout knobs' own ranges
        timeout, stall = self.minibatch_timeout_s, self.stall_timeout_s
        if timeout is not None and stall is not None and stall <= timeout:
            raise ValueError(
                f"async_config.stall_timeout_s={stall:g} must exceed minibatch_timeout_s={timeout:g}: "
                "a hung minibatch must be re-issued before the run is declared stalled."
            )

    def deadline_settings(self) -> DeadlineSettings:
        """How each GU bounds one minibatch's generation (``runtime.minibatch_deadline``)."""
        return DeadlineSettings(
            fixed_s=self.minibatch_timeout_s,
            factor=self.minibatch_timeout_factor,
            floor_s=self.minibatch_timeout_floor_s,
            warmup_s=self.minibatch_timeout_warmup_s,
            stall_s=self.stall_timeout_s,
        )

    @property
    def samples_per_global_batch(self) -> int:
        return self.num_prompts_per_global_batch * self.num_samples_per_prompt

    def check_minibatch_fits(self, max_minibatch_prompts: int) -> None:
        """Raise if the lag bound can deadlock with minibatches of this many prompts.

        With fresh weights the lag budget admits a minibatch of ``n`` prompts whenever fewer than a
        global batch ``P`` is outstanding iff ``n <= (L - (snapshot_interval - 1)) * P + 1``; beyond
        that, generation and training can each wait for the other forever.
        """
        if self.max_policy_lag is None:
            return
        slack = self.max_policy_lag - (self.snapshot_interval - 1)
        limit = slack * self.num_prompts_per_global_batch + 1
        if max_minibatch_prompts > limit:
            raise ValueError(
                f"a minibatch of {max_minibatch_prompts} prompts cannot always be admitted with "
                f"max_policy_lag={self.max_policy_lag}, snapshot_interval={self.snapshot_interval} and "
                f"{self.num_prompts_per_global_batch} prompts per global batch (limit {limit}); raise "
                "max_policy_lag, enlarge the global batch, or schedule smaller minibatches."
            )
