"""How long one minibatch may generate before its GU declares the engine hung.

A fixed number of seconds (``minibatch_timeout_s``) fits no run: the tiny CPU demo finishes a
minibatch in seconds, a 30 B model with 8 k-token answers in many minutes. By default the bound
is therefore derived from the run: every completed minibatch tells its GU how many seconds one
predicted token took (duration / the ASP schedule's predicted load), and a new minibatch may take
``minibatch_timeout_factor`` times its own predicted load at the slowest such rate seen recently,
never less than ``minibatch_timeout_floor_s``. An engine's first minibatch (warm-up, graph
capture, compilation) and any minibatch before its GU has measured one get
``minibatch_timeout_warmup_s`` instead, and first minibatches are not measured: their start-up
cost would inflate every later bound.
Every derived bound stays below the stall detector's (``stall_timeout_s``), so a hung minibatch is
re-issued before the whole run is declared stalled.

Per-token rates, not raw durations, because minibatches are length-homogeneous by design: a
minibatch of short answers must not inherit the bound of the longest ones, nor the reverse.

Multi-turn minibatches also wait on tools, which no token count predicts: a completion reports
its slowest trajectory's tool seconds, which are taken out of the measured duration before the
per-token rate is formed (tool time must not read as slow decoding) and allowed for on top of the
token bound instead, as ``factor`` times the largest such wait seen recently.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# Recent completions the slowest rate is taken over: long enough to hold the tail of a length
# distribution, short enough to follow a policy whose answers grow.
WINDOW = 32
# Derived bounds stop this far below the stall detector's.
STALL_MARGIN = 0.8


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadlineSettings:
    """The ``async_config`` timeout knobs as one GU applies them."""

    fixed_s: float | None
    """``minibatch_timeout_s``: an explicit bound in seconds (then nothing is derived)."""
    factor: float | None
    """``minibatch_timeout_factor``; None with ``fixed_s`` None = no bound at all."""
    floor_s: float
    warmup_s: float
    stall_s: float | None
    """``stall_timeout_s`` (derived bounds stay below it)."""

    def __post_init__(self) -> None:
        if self.factor is not None and not self.factor > 1:
            raise ValueError(
                f"async_config.minibatch_timeout_factor={self.factor} must be > 1 (a multiple of the "
                "expected duration), or null to derive no timeout"
            )
        for name in ("floor_s", "warmup_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"async_config.minibatch_timeout_{name} must be > 0 seconds")


class MinibatchDeadlines:
    """One GU's running estimate; ``timeout_for`` before each start, ``observe`` after each finish."""

    def __init__(self, settings: DeadlineSettings) -> None:
        self.settings = settings
        self._rates: deque[float] = deque(maxlen=WINDOW)
        self._tool_waits: deque[float] = deque(maxlen=WINDOW)

    def observe(self, seconds: float, predicted_load: float, tool_seconds: float = 0.0) -> None:
        """A minibatch of ``predicted_load`` predicted tokens finished in ``seconds``, its slowest
        trajectory having waited ``tool_seconds`` on tools (0 for single-turn rollouts)."""
        tool = min(max(tool_seconds, 0.0), seconds)
        self._rates.append((seconds - tool) / max(predicted_load, 1.0))
        self._tool_waits.append(tool)

    def timeout_for(self, predicted_load: float, *, warm_engine: bool = True) -> float | None:
        """Seconds the next minibatch of ``predicted_load`` tokens may take; None = unbounded.
        ``warm_engine``: the engine has finished a minibatch before (else it may still warm up)."""
        s = self.settings
        if s.fixed_s is not None:
            return s.fixed_s
        if s.factor is None:
            return None
        if not warm_engine or not self._rates:
            bound = s.warmup_s
        else:
            decode = max(self._rates) * max(predicted_load, 1.0)
            bound = max(s.floor_s, s.factor * (decode + max(self._tool_waits)))
        if s.stall_s is not None:
            bound = min(bound, STALL_MARGIN * s.stall_s)
        return bound


@dataclass(slots=True)
class Running:
    actor_id: int
    started: float
    load: float
    deadline: float | None


class RunningMinibatches:
    """One GU's minibatches in flight, keyed by their result reference: when each started, its
    deadline, and which engines are warm. The GU calls ``start`` / ``pop`` / ``succeeded`` and asks
    ``expired`` when it wakes; everything here is plain bookkeeping, so it is tested without Ray."""

    def __init__(self, settings: DeadlineSettings) -> None:
        self.model = MinibatchDeadlines(settings)
        self._running: dict[object, Running] = {}
        self._warm: set[int] = set()  # actor slots whose current engine has finished a minibatch

    def start(self, key: object, actor_id: int, predicted_load: float, now: float) -> None:
        timeout = self.model.timeout_for(predicted_load, warm_engine=actor_id in self._warm)
        deadline = None if timeout is None else now + timeout
        self._running[key] = Running(actor_id=actor_id, started=now, load=predicted_load, deadline=deadline)

    def pop(self, key: object) -> Running | None:
        """Stop tracking ``key`` (finished, failed or abandoned); its record, if it ran."""
        return self._running.pop(key, None)

    def succeeded(self, run: Running, now: float, *, tool_seconds: float = 0.0) -> None:
        """``run`` completed: measured, unless it was its engine's first (warm-up inside).
        ``tool_seconds``: its slowest trajectory's tool wait (``GenerationReceipt.max_tool_seconds``)."""
        if run.actor_id in self._warm:
            self.model.observe(now - run.started, run.load, tool_seconds)
        self._warm.add(run.actor_id)

    def engine_replaced(self, actor_id: int) -> None:
        self._warm.discard(actor_id)

    def deadlines(self) -> list[float]:
        return [r.deadline for r in self._running.values() if r.deadline is not None]

    def expired(self, now: float) -> list[tuple[object, int, str]]:
        """``(key, actor id, why)`` of every minibatch past its deadline."""
        return [
            (key, r.actor_id, f"no result after {now - r.started:.0f} s (bound {r.deadline - r.started:.0f} s "
             f"for {r.load:.0f} predicted tokens; async_config.minibatch_timeout_*)")
            for key, r in self._running.items()
            if r.deadline is not None and r.deadline <= now
        ]  # fmt: skip
