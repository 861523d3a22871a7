"""Settings of the asynchronous pipeline's control logic (the ``async_config`` knobs it reads)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeConfig:
    num_prompts_per_global_batch: int
    """Prompts consumed by one trainer step (batch sizes are counted in prompts)."""

    num_samples_per_prompt: int
    """Responses generated per prompt (GRPO's ``n``); all of them travel together."""

    queue_max_samples: int
    """``Q_max``: pause the start of new minibatches once the Training Queue holds more samples."""

    queue_resume_samples: int
    """Resume starting minibatches once the Training Queue has drained to this many samples or
    fewer. Must be below ``queue_max_samples``; the gap is the hysteresis that stops the pause
    signal from flapping on every arrival."""

    gu_queue_low: int = 5
    """Refill a GU's input queue when it holds this many not-yet-started minibatches or fewer."""

    gu_queue_high: int = 10
    """Refill up to this many queued minibatches (may be exceeded by less than one batch group,
    because batch groups are dispatched whole)."""

    max_policy_lag: int | None = 4
    """Hard bound on ``d_off = consuming step - generating version``; ``None`` (YAML
    ``async_config.max_policy_lag: null``) disables it and leaves only the backpressure bound
    (the paper's behaviour)."""

    snapshot_interval: int = 1
    """Trainer steps between weight snapshots; actors can be up to ``snapshot_interval - 1``
    versions behind even right after a reload, which the lag bound must leave room for."""

    minibatch_timeout_s: float | None = None
    """Longest one minibatch may generate before its GU kills the actor, re-issues the minibatch
    and starts a replacement; ``None`` disables it (a hung engine is then caught only by the
    stall detector, which fails the run instead of recovering)."""

    actor_max_restarts: int = 3
    """Replacements per actor slot after it raised, timed out or died; beyond that the slot is
    retired and its GU carries on with the actors it has left."""

    minibatch_max_attempts: int = 3
    """Failed attempts (error, timeout, death) after which a minibatch is poison: the run stops
    with an error naming it and its prompts instead of cascading through every actor."""

    stall_timeout_s: float | None = 900.0
    """The driver's wait fails with a diagnosis (stuck unit and reason) after this long without
    progress (an accepted completion, a popped batch, a trained step, a snapshot); ``None``
    waits forever."""

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
        timeout, stall = self.minibatch_timeout_s, self.stall_timeout_s
        if timeout is not None and stall is not None and stall <= timeout:
            raise ValueError(
                f"async_config.stall_timeout_s={stall:g} must exceed minibatch_timeout_s={timeout:g}: "
                "a hung minibatch must be re-issued before the run is declared stalled."
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
