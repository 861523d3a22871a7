"""Start-up decisions of the async pipeline, kept out of the driver so it reads as a schedule.

Which prompts the run schedules: exactly ``train_iters × global_batch_size``, drawn with the same
pass/shuffle logic as the hybrid loop (``components.global_batches``), so both pipelines see the
same prompts and ``prompts_scheduled == prompts_consumed`` holds by construction. The ASP schedule
reorders them across the whole run; that is the point of it. A prompt drawn again in a later pass
over a small dataset gets an alias id (``<id>@<pass>``), because the runtime tracks prompts by id
and each scheduled prompt must be consumed exactly once.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.runtime.config import RuntimeConfig
from mindspeed_rl.trainer import components

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.runtime.records import ScheduledMinibatch
    from mindspeed_rl.trainer.checkpointing import ResumePoint
    from mindspeed_rl.trainer.pipeline_inputs import PipelineInputs
    from mindspeed_rl.utils.ray_setup import ReservedPlacement
    from mindspeed_rl.workers.fault_plan import FaultPlan
    from mindspeed_rl.workers.generation_unit import GuSpec

logger = logging.getLogger(__name__)
SCHEDULE_FILE = "asp_schedule.json"


def run_prompts(config: GRPOConfig, records: Sequence[PromptRecord]) -> list[PromptRecord]:
    """The run's prompts in hybrid's draw order, repeated draws renamed ``<id>@<pass>``."""
    by_id = {r.prompt_id: r for r in records}
    seen: Counter[str] = Counter()
    chosen: list[PromptRecord] = []
    for batch in components.global_batches(config, [r.prompt_id for r in records]):
        for pid in batch:
            alias = pid if seen[pid] == 0 else f"{pid}@{seen[pid]}"
            seen[pid] += 1
            chosen.append(dataclasses.replace(by_id[pid], prompt_id=alias))
    return chosen


def asp_inputs(config: GRPOConfig, policy_path: str, run_dir: Path) -> PipelineInputs:
    """The run's training prompts (hybrid's draw order) with their ASP schedule, saved into
    ``run_dir``, and the held-out prompts of the split."""
    from mindspeed_rl.datasets.split import write_split_ids
    from mindspeed_rl.trainer.pipeline_inputs import PipelineInputs

    splits = components.load_prompt_splits(config, components.load_tokenizer(policy_path))
    write_split_ids(run_dir / "split_ids.json", splits)
    records = run_prompts(config, splits.train)
    return PipelineInputs(
        prompts=tuple(records), schedule=build_schedule(config, records, run_dir), held_out=splits.valid
    )


def run_inputs(
    config: GRPOConfig,
    policy_path: str,
    run_dir: Path,
    given: PipelineInputs | None,
    resumed: ResumePoint | None,
) -> PipelineInputs:
    """``given`` (built in ``cli/`` for tests) or the config's inputs. A resumed run keeps the
    checkpoint's schedule minus its consumed prompts, never a rebuilt one: a rebuild would reorder
    prompts across the consumed/unconsumed line if anything in the predictor changed."""
    if resumed is None:
        return given or asp_inputs(config, policy_path, run_dir)
    from mindspeed_rl.datasets.split import write_split_ids
    from mindspeed_rl.trainer.pipeline_inputs import PipelineInputs

    if given is None:
        splits = components.load_prompt_splits(config, components.load_tokenizer(policy_path))
        write_split_ids(run_dir / "split_ids.json", splits)
        records = tuple(run_prompts(config, splits.train))
        given = PipelineInputs(prompts=records, schedule=(), held_out=splits.valid)
    known = {r.prompt_id for r in given.prompts}
    missing = [p for mb in resumed.schedule for p in mb.prompt_ids if p not in known]
    if missing:
        raise ValueError(
            f"{len(missing)} prompts of checkpoint {resumed.folder}'s schedule (e.g. {missing[:3]}) are "
            "not in this run's data; resume with the same megatron_training.data_path contents"
        )
    saved = resumed.folder / SCHEDULE_FILE
    if saved.is_file():  # the run dir carries its schedule artifact, as a fresh run's does
        shutil.copy2(saved, run_dir / SCHEDULE_FILE)
    return dataclasses.replace(given, schedule=resumed.remaining_schedule)


def true_lengths(config: GRPOConfig, records: Sequence[PromptRecord]) -> dict[str, float] | None:
    """Response lengths a built-in task knows exactly (the demo: answer + eos), else ``None``."""
    if config.megatron_training.training.data_path != "builtin:demo":
        return None
    return {r.prompt_id: float(len(r.label) + 1) for r in records}


def build_schedule(
    config: GRPOConfig, records: Sequence[PromptRecord], run_dir: Path
) -> tuple[ScheduledMinibatch, ...]:
    """The ASP schedule of the run's prompts, saved into the run directory for reuse."""
    from mindspeed_rl.datasets.asp_schedule import build_run_schedule

    asp = config.asp_config
    lengths = (
        true_lengths(config, records)
        if asp.predictor.type == "oracle_noisy" and not asp.predictor.path
        else None
    )
    run_schedule = build_run_schedule(asp, records, true_lengths=lengths)
    run_schedule.schedule.save(run_dir / SCHEDULE_FILE)
    logger.info(
        "ASP schedule: %d prompts in %d minibatches, predictor quality %s",
        run_schedule.num_prompts,
        len(run_schedule.minibatches),
        run_schedule.predictor_quality,
    )
    return run_schedule.minibatches


def runtime_config(config: GRPOConfig) -> RuntimeConfig:
    """The Control Unit's settings, from the run plan's one mapping (``run_plan.runtime_config``)."""
    from mindspeed_rl.plan.build import runtime_config as plan_runtime_config

    return plan_runtime_config(config)


def snapshot_root(config: GRPOConfig, run_dir: Path) -> Path:
    """This run's snapshot folder: ``<snapshot_dir>/<run dir name>/``, or ``<run_dir>/snapshots``.

    A configured ``snapshot_dir`` is reused run after run (``./snapshots`` in the cluster YAMLs),
    so each run gets its own subfolder (the run dir name is unique: timestamp + config name);
    see ``weights/store.py`` for why a subfolder rather than refusing the folder.
    """
    from mindspeed_rl.weights.store import run_root

    configured = config.async_config.snapshot_dir
    return run_root(Path(configured), run_dir.name) if configured else run_dir / "snapshots"


def check_resources(config: GRPOConfig, available: Mapping[str, float]) -> None:
    """The plan's layout checks (``build_run_plan``) and its resource fit against ``available``."""
    from mindspeed_rl.plan.build import build_run_plan

    build_run_plan(config).check_fits(available)


def gu_specs(
    config: GRPOConfig,
    policy_path: str,
    prompts: Any,
    snapshots: Path,
    faults: FaultPlan,
    *,
    forced_lengths: Mapping[str, tuple[int, ...]] | None = None,
    reserved: ReservedPlacement | None = None,
) -> list[GuSpec]:
    """One spec per Generation Unit; ``prompts`` is the prompt mapping or a Ray reference to it.
    ``reserved`` (the run's placement) gives each actor its own options (its bundle)."""
    from mindspeed_rl.plan.build import rollout_spec
    from mindspeed_rl.utils.ray_setup import ray_actor_options
    from mindspeed_rl.workers.generation_unit import GuSpec

    a = config.async_config
    rollout = rollout_spec(config)
    return [
        GuSpec(
            gu_id=g,
            rollout=rollout,
            policy_path=policy_path,
            prompts=prompts,
            num_actors=a.actors_per_unit,
            actor_options=ray_actor_options(a.actor_resources),
            per_actor_options=()
            if reserved is None
            else tuple(
                reserved.generation_actor_options(g * a.actors_per_unit + i, a.actor_resources)
                for i in range(a.actors_per_unit)
            ),
            actor_num_cpus=a.actor_resources.num_cpus,
            cache_dir=str(snapshots / f"gu{g}"),
            seed=config.megatron_training.training.seed,
            faults=faults,
            forced_lengths=forced_lengths,
        )
        for g in range(a.num_generation_units)
    ]
