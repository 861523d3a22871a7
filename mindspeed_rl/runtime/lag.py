"""Measured off-policy distance, with the Eq. 4 estimate recorded alongside.

Every sample carries the policy version that generated it (with partial rollouts, that of its
oldest token), so ``d_off = step - version`` is measured exactly at consumption. For comparison, each arriving minibatch gets the paper's
estimate from the queue depth it found and the mean timings measured so far; a step's estimate
is the mean over the prompts it consumes.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindspeed_rl.runtime.append_log import AppendLog
from mindspeed_rl.runtime.records import GlobalBatch


@dataclass(frozen=True, slots=True, kw_only=True)
class StepLag:
    step: int
    num_samples: int
    d_off_mean: float
    d_off_max: int
    d_off_min: int
    d_off_estimate_mean: float | None
    """Mean Eq. 4 estimate over the step's prompts; ``None`` if none had timings yet."""
    split_samples: int = 0
    """Samples whose tokens come from more than one version (partial rollouts)."""
    split_segments: int = 0
    """Segments of those samples, summed."""
    max_segments: int = 1


class LagTracker:
    def __init__(self) -> None:
        self._estimates: dict[int, float | None] = {}  # minibatch id -> Eq. 4 at its arrival
        self.steps: AppendLog[StepLag] = AppendLog()
        """One record per step; the Control Unit trims what its digest has read, so the
        whole-run figures below are running aggregates, not scans of the log."""
        self._sum_d_off = 0
        self._num_samples = 0
        self._max_d_off: int | None = None
        self._sum_estimates = 0.0
        self._num_estimates = 0
        self.partial_samples_total = 0
        self.partial_segments_total = 0
        """Segments of the consumed samples that crossed a refresh, summed (0 without partial rollouts)."""
        self.max_segments_per_sample = 1

    def record_arrival(self, minibatch_id: int, estimate: float | None) -> None:
        self._estimates[minibatch_id] = estimate

    def on_consumed(self, batch: GlobalBatch) -> StepLag:
        d_offs = [batch.step - s.policy_version for s in batch.samples]
        assert d_offs, "a consumed global batch has samples"
        assert min(d_offs) >= 0, f"step {batch.step} consumed samples from a future policy version"
        estimates = [e for p in batch.prompts if (e := self._estimates.get(p.minibatch_id)) is not None]
        segments = [s.num_segments for s in batch.samples if s.segments]
        lag = StepLag(
            step=batch.step,
            num_samples=len(d_offs),
            d_off_mean=sum(d_offs) / len(d_offs),
            d_off_max=max(d_offs),
            d_off_min=min(d_offs),
            d_off_estimate_mean=sum(estimates) / len(estimates) if estimates else None,
            split_samples=len(segments),
            split_segments=sum(segments),
            max_segments=max(segments, default=1),
        )
        self.steps.append(lag)
        self.partial_samples_total += lag.split_samples
        self.partial_segments_total += lag.split_segments
        self.max_segments_per_sample = max(self.max_segments_per_sample, lag.max_segments)
        self._sum_d_off += sum(d_offs)
        self._num_samples += len(d_offs)
        self._max_d_off = lag.d_off_max if self._max_d_off is None else max(self._max_d_off, lag.d_off_max)
        if lag.d_off_estimate_mean is not None:
            self._sum_estimates += lag.d_off_estimate_mean
            self._num_estimates += 1
        return lag

    @property
    def max_d_off(self) -> int | None:
        return self._max_d_off

    @property
    def mean_d_off(self) -> float | None:
        return self._sum_d_off / self._num_samples if self._num_samples else None

    @property
    def mean_estimate(self) -> float | None:
        """Mean over steps of each step's mean estimate (steps without one are left out)."""
        return self._sum_estimates / self._num_estimates if self._num_estimates else None
