"""Where the suite's time goes under ``-n 2 --dist loadscope``: each test phase's duration, the
worker that ran it and its stream, summed per stream and per worker (``--stream-durations PATH``,
which ``make test`` passes). The sums say whether the e2e stream or the rest is the long pole, the
figure the split in ``tests/conftest.py`` is tuned by."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

SLOWEST = 15


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseTime:
    """One test phase (setup, call or teardown) as a worker reported it."""

    nodeid: str
    when: str
    seconds: float
    worker: str
    """The xdist worker (``gw0``, ``gw1``), or ``main`` without xdist."""


def summarize(phases: Iterable[PhaseTime], stream_of: Callable[[str], str]) -> dict[str, Any]:
    """Seconds per stream and per worker, the number of tests per stream, and the slowest phases.
    ``stream_of`` maps a nodeid to its stream."""
    phases = list(phases)
    per_stream: dict[str, float] = defaultdict(float)
    per_worker: dict[str, float] = defaultdict(float)
    tests: dict[str, set[str]] = defaultdict(set)
    per_file: dict[str, float] = defaultdict(float)
    for phase in phases:
        per_file[phase.nodeid.split("::", 1)[0]] += phase.seconds
        stream = stream_of(phase.nodeid)
        per_stream[stream] += phase.seconds
        per_worker[phase.worker] += phase.seconds
        tests[stream].add(phase.nodeid)
    slowest = sorted(phases, key=lambda p: -p.seconds)[:SLOWEST]
    return {
        "seconds_per_stream": {k: round(v, 2) for k, v in sorted(per_stream.items())},
        "tests_per_stream": {k: len(v) for k, v in sorted(tests.items())},
        "seconds_per_worker": {k: round(v, 2) for k, v in sorted(per_worker.items())},
        # Every file, slowest first: what a merge of end-to-end runs or a move between streams buys.
        "seconds_per_file": {k: round(v, 2) for k, v in sorted(per_file.items(), key=lambda kv: -kv[1])},
        "slowest": [
            {"nodeid": p.nodeid, "when": p.when, "seconds": round(p.seconds, 2), "worker": p.worker}
            for p in slowest
        ],
    }
