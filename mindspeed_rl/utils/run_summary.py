"""``summary.json``: the end-of-run facts every run directory carries (hybrid and async)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REQUIRED_KEYS = (
    "pipeline",
    "prompts_scheduled",
    "prompts_consumed",
    "duplicate_minibatches_dropped",
    "minibatches_reissued",
    "max_policy_lag_measured",
    "max_queue_depth_samples",
    "queue_limit_samples",
)


def write_summary(
    run_dir: str | Path,
    *,
    pipeline: str,
    prompts_scheduled: int,
    prompts_consumed: int,
    duplicate_minibatches_dropped: int = 0,
    minibatches_reissued: int = 0,
    max_policy_lag_measured: int,
    max_queue_depth_samples: int,
    queue_limit_samples: int | None,
    **extra: Any,
) -> Path:
    summary = {
        "pipeline": pipeline,
        "prompts_scheduled": prompts_scheduled,
        "prompts_consumed": prompts_consumed,
        "duplicate_minibatches_dropped": duplicate_minibatches_dropped,
        "minibatches_reissued": minibatches_reissued,
        "max_policy_lag_measured": max_policy_lag_measured,
        "max_queue_depth_samples": max_queue_depth_samples,
        "queue_limit_samples": queue_limit_samples,
        **extra,
    }
    path = Path(run_dir) / "summary.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
