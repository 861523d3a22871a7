"""The async run's ASP schedule: its prompts ordered into minibatches by predicted length
(``datasets.asp_schedule``), saved as ``asp_schedule.json`` in the run directory.

Reads the plan's ``asp`` section; the built-in demo task hands the noisy oracle its exact lengths.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import ASPConfig
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.plan.build import DataSpec
    from mindspeed_rl.runtime.records import ScheduledMinibatch

logger = logging.getLogger(__name__)
SCHEDULE_FILE = "asp_schedule.json"


def true_lengths(data: DataSpec, records: Sequence[PromptRecord]) -> dict[str, float] | None:
    """Response lengths a built-in task knows exactly (the demo: answer + eos), else ``None``."""
    if data.data_path not in ("builtin:demo", "builtin:demo_short"):
        return None
    return {r.prompt_id: float(len(r.label) + 1) for r in records}


def build_schedule(
    asp: ASPConfig, data: DataSpec, records: Sequence[PromptRecord], run_dir: Path
) -> tuple[ScheduledMinibatch, ...]:
    """The ASP schedule of the run's prompts, saved into the run directory for reuse."""
    from mindspeed_rl.datasets.asp_schedule import build_run_schedule

    lengths = (
        true_lengths(data, records)
        if asp.predictor.type == "oracle_noisy" and not asp.predictor.path
        else None
    )
    built = build_run_schedule(asp, records, true_lengths=lengths)
    built.schedule.save(run_dir / SCHEDULE_FILE)
    logger.info(
        "ASP schedule: %d prompts in %d minibatches, predictor quality %s",
        built.num_prompts,
        len(built.minibatches),
        built.predictor_quality,
    )
    return built.minibatches
