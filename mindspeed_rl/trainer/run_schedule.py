"""The async run's ASP schedule: its prompts ordered into minibatches by predicted length
(``datasets.asp_schedule``), saved as ``asp_schedule.json`` in the run directory.

Reads the plan's ``asp`` section; the built-in demo task hands the noisy oracle its exact lengths.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
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
    """Response lengths a built-in task knows exactly (the demo: answer + eos; arith_tools: the
    right tool trajectory, tool response included), else ``None``."""
    if data.data_path == "builtin:arith_tools":
        from mindspeed_rl.datasets.arith_tools_task import trajectory_tokens

        return {r.prompt_id: float(trajectory_tokens(r.text)) for r in records}
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


def chunk_scheduler(
    asp: ASPConfig, data: DataSpec, known: Sequence[PromptRecord] | None
) -> Callable[[Sequence[PromptRecord]], tuple[ScheduledMinibatch, ...]]:
    """How a streaming window (``asp_config.window``) schedules each chunk it draws.

    The noisy oracle is the one predictor that cannot be run chunk by chunk as configured: its
    noise ``nu`` is searched to hit ``target_tau`` on the items it is given, and a chunk of one
    or two global batches is too few items to hit it (a handful of prompts gives tau in coarse
    steps). So ``nu`` is calibrated once, on every length the run can know up front (``known``:
    the split, when the stream is one; else the lengths file; else the first chunk drawn), and
    each chunk then gets that fixed ``nu`` with its own noise draw (seeded by its prompt ids, so a
    resumed run redraws the same). Every other predictor scores prompts one by one."""
    import dataclasses
    import zlib

    from mindspeed_rl.datasets.asp_schedule import build_run_schedule

    oracle_builtin = asp.predictor.type == "oracle_noisy" and not asp.predictor.path
    fixed: dict[str, ASPConfig] = {}

    def lengths(chunk: Sequence[PromptRecord]) -> dict[str, float] | None:
        return true_lengths(data, chunk) if oracle_builtin else None

    def calibrated(first: Sequence[PromptRecord]) -> ASPConfig:
        if "asp" not in fixed:
            fixed["asp"] = dataclasses.replace(
                asp,
                predictor=dataclasses.replace(
                    asp.predictor, calibrate_nu=False, noise_sigma=_oracle_nu(asp, data, known or first)
                ),
            )
        return fixed["asp"]

    def schedule_chunk(chunk: Sequence[PromptRecord]) -> tuple[ScheduledMinibatch, ...]:
        chosen = asp
        if asp.predictor.type == "oracle_noisy" and asp.predictor.calibrate_nu:
            seed = zlib.crc32("\n".join(r.prompt_id for r in chunk).encode()) & 0x7FFFFFFF
            chosen = dataclasses.replace(calibrated(chunk), seed=seed)
        return build_run_schedule(chosen, chunk, true_lengths=lengths(chunk)).minibatches

    return schedule_chunk


def _oracle_nu(asp: ASPConfig, data: DataSpec, records: Sequence[PromptRecord]) -> float:
    """The oracle noise that gives ``target_tau`` over ``records`` (the lengths file's rows when
    the oracle reads one), with the fix named when there are too few to reach it."""
    import numpy as np

    from asp_scheduler.predictors.from_file import load_predictions
    from asp_scheduler.predictors.noisy_oracle import noisy_oracle_predictions

    path = asp.predictor.path
    table = load_predictions(path, length_field="length") if path else true_lengths(data, records)
    if table is None:
        raise ValueError(
            "predictor.type oracle_noisy needs measured lengths: set predictor.path, or use a builtin task"
        )
    try:
        return float(
            noisy_oracle_predictions(np.asarray(list(table.values())), asp.predictor.target_tau, asp.seed).nu
        )
    except ValueError as err:
        raise ValueError(
            f"asp_config.window: the noisy oracle could not be calibrated on {len(table)} lengths ({err}); "
            "set asp_config.predictor.calibrate_nu=false with a noise_sigma, or widen the window"
        ) from err
