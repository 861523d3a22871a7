"""The Control Unit's event log as the run sees it: the per-step digest (``step_metrics``) and
``events.jsonl``, appended to once per trainer step and at the end, so the log never crosses one
giant RPC nor grows with the run (what the digest and the file have both read is forgotten)."""

from __future__ import annotations

from typing import Any

from mindspeed_rl.runtime import events as ev
from mindspeed_rl.runtime.controller import ControlLoop
from mindspeed_rl.runtime.step_metrics import MetricsCursor, step_metrics


class EventStream:
    def __init__(self, path: str | None) -> None:
        self.log = ev.EventLog()
        """The ControlLoop's event log (it appends; this class reads, writes and trims)."""
        self._file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        self._cursor = MetricsCursor()

    def digest(self, loop: ControlLoop) -> dict[str, float]:
        """Observability digest since the previous one."""
        seen = loop.observe(
            arrivals_since=self._cursor.num_arrivals, lag_steps_since=self._cursor.num_lag_steps
        )
        return step_metrics(seen, self.log, self._cursor)

    def flush(self, loop: ControlLoop) -> None:
        """Append the new events to the file and forget what the digest has read too."""
        if self._file is not None:
            self.log.write_new(self._file)
            self.log.trim(self._cursor.num_events)
        loop.trim_history(arrivals=self._cursor.num_arrivals, lag_steps=self._cursor.num_lag_steps)

    def close(self) -> int:
        """Write the events not written yet and close the file; returns the events logged."""
        if self._file is not None:
            self.log.write_new(self._file)
            self._file.close()
            self._file = None
        return len(self.log)

    def records(self) -> list[dict[str, Any]]:
        """The events still held as JSON-ready dicts (all of them unless streamed to a file)."""
        return [ev.EventLog.to_json_dict(e) for e in self.log]
