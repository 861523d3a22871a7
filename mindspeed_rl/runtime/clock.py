"""Time sources for the runtime.

Every runtime component takes a ``Clock`` instead of calling ``time`` directly, so the same
code runs under wall-clock time in the Ray actors and under modeled time in tests and in the
discrete-event simulator (``mindspeed_rl.sim``).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Anything that can tell the current time in seconds (monotonic, arbitrary origin)."""

    def now(self) -> float: ...


class WallClock:
    """Seconds since the epoch (``time.time``): comparable across processes and, with NTP, across
    machines. The ControlLoop's default, because it compares its own time with timestamps that
    generation actors take in other processes (``started_at``/``finished_at``)."""

    def now(self) -> float:
        return time.time()


class MonotonicClock:
    """Time that never goes backwards (``time.monotonic``); only comparable within one process."""

    def now(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that only moves when told to; for tests and simulations."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def set(self, t: float) -> None:
        """Jump to absolute time ``t``; time may not go backwards."""
        if t < self._now:
            raise ValueError(
                f"FakeClock cannot go backwards (now={self._now}, asked for {t}); "
                "process events in time order."
            )
        self._now = float(t)

    def advance(self, dt: float) -> None:
        """Move forward by ``dt`` seconds (``dt >= 0``)."""
        if dt < 0:
            raise ValueError(f"FakeClock.advance needs dt >= 0, got {dt}; use set() for absolute times.")
        self._now += dt
