"""Backpressure on the Training Queue depth, with hysteresis.

Pause when the queue holds more than ``max_samples``; resume only once it has drained to
``resume_samples`` or fewer. A single threshold would flip the signal on every arrival and pop
near the limit, and each flip costs GUs a round trip; the gap absorbs that.

The pause applies to *starting* minibatches (queued ones included); running ones always finish.
"""

from __future__ import annotations

from mindspeed_rl.runtime.clock import Clock


class Backpressure:
    def __init__(self, *, max_samples: int, resume_samples: int, clock: Clock) -> None:
        if not 0 <= resume_samples < max_samples:
            raise ValueError(
                f"need 0 <= resume_samples < max_samples, got {resume_samples} and {max_samples}; "
                "set the resume level below the pause threshold."
            )
        self.max_samples = max_samples
        self.resume_samples = resume_samples
        self._clock = clock
        self._paused = False
        self._paused_since = 0.0
        self._seconds_paused_closed = 0.0
        self.num_pauses = 0

    @property
    def paused(self) -> bool:
        return self._paused

    def update(self, depth_samples: int) -> bool | None:
        """Feed the current queue depth; returns the new state when it flips, else ``None``."""
        if not self._paused and depth_samples > self.max_samples:
            self._paused, self._paused_since = True, self._clock.now()
            self.num_pauses += 1
            return True
        if self._paused and depth_samples <= self.resume_samples:
            self._paused = False
            self._seconds_paused_closed += self._clock.now() - self._paused_since
            return False
        return None

    @property
    def seconds_paused(self) -> float:
        """Total time spent paused, including the pause in progress."""
        open_pause = self._clock.now() - self._paused_since if self._paused else 0.0
        return self._seconds_paused_closed + open_pause
