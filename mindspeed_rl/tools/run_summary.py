"""The run's tool use in ``summary.json`` (``"tools"``), from the per-iteration ``tools/*`` metrics.

Both pipelines log ``tools/*`` every trainer step (``workers.training_unit.tool_metrics``); the
summary adds them up so a run's tool cost and how its tool use changed are read in one place:
totals (calls, errors, truncated responses, tool seconds), means per sample, and the calling and
well-formed-call fractions of the first and last ``EDGE`` iterations (the learning signal of a
tool-use run, as ``reward_first`` / ``reward_last`` are for the reward).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EDGE = 5
"""Iterations averaged at each end, as the run-end block does for the reward."""


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def tool_summary(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``tools`` block of ``summary.json``; None when no iteration used tools."""
    rows = [r for r in records if "tools/calls" in r]
    if not rows:
        return None
    calls = sum(float(r["tools/calls"]) for r in rows)
    errors = sum(float(r["tools/errors"]) for r in rows)

    def edge(key: str, part: slice) -> float | None:
        return _mean([float(r[key]) for r in rows[part] if key in r])

    return {
        "iterations": len(rows),
        "calls_total": int(calls),
        "errors_total": int(errors),
        "error_fraction": errors / calls if calls else 0.0,
        "truncated_responses_total": int(sum(float(r.get("tools/truncated_responses", 0.0)) for r in rows)),
        "seconds_total": sum(float(r.get("tools/seconds", 0.0)) for r in rows),
        "calls_per_sample_mean": edge("tools/calls_per_sample", slice(None)),
        "calling_fraction_first": edge("tools/calling_fraction", slice(None, EDGE)),
        "calling_fraction_last": edge("tools/calling_fraction", slice(-EDGE, None)),
        "ok_call_fraction_first": edge("tools/ok_call_fraction", slice(None, EDGE)),
        "ok_call_fraction_last": edge("tools/ok_call_fraction", slice(-EDGE, None)),
    }


def add_tool_summary(run_dir: Path) -> None:
    """Write the ``tools`` block into ``run_dir/summary.json`` (nothing for a run without tools)."""
    from mindspeed_rl.utils.metrics import read_metrics

    summary_path, metrics_path = run_dir / "summary.json", run_dir / "metrics.jsonl"
    if not summary_path.is_file() or not metrics_path.is_file():
        return
    block = tool_summary(read_metrics(metrics_path))
    if block is None:
        return
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    summary["tools"] = block
    tmp = summary_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, summary_path)
