"""What every run does before its first iteration and after its last, whichever the pipeline.

    build_run_plan ─► role environments ─► resume point ─► placement on the live cluster ─► policy model ─► prompt split
        (the config is read once, here; everything after reads the plan)
    checkpointer(run, schedule)   the lineage of consumed prompts and its periodic checkpoints
    finish(run_dir, lineage)      the lineage's counts into summary.json

The order is the point: a foreign checkpoint is refused before anything else, and a layout that
fits no node is refused before any model or data work (Ray would queue it forever).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mindspeed_rl.plan.build import RunPlan, build_run_plan
from mindspeed_rl.trainer import checkpointing as ckpt
from mindspeed_rl.trainer import run_end
from mindspeed_rl.trainer.policy_model import prepare_policy_model
from mindspeed_rl.trainer.prompts import load_run_split, streams_from_files
from mindspeed_rl.trainer.role_processes import check_plan_envs

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.datasets.split import PromptSplits
    from mindspeed_rl.runtime.records import ScheduledMinibatch
    from mindspeed_rl.utils.env_probe import EnvReport
    from mindspeed_rl.utils.placement import Placement
    from mindspeed_rl.utils.role_envs import Role


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStart:
    """A run ready to start its workers."""

    plan: RunPlan
    run_dir: Path
    resumed: ckpt.ResumePoint | None
    """The checkpoint this run resumes; None for a fresh run."""
    placement: Placement
    """Every actor's node and devices on the live cluster (``RunPlan.check_fits``)."""
    policy_path: str
    """The policy's HF folder: what the trainer starts from."""
    splits: PromptSplits | None
    """The configured data's split (its ids are in ``split_ids.json``); None when the run was
    handed its prompts (a trace replay)."""
    env_reports: Mapping[Role, EnvReport] | None = None
    """Each role's environment as probed at start (``async_config.role_envs``); None without."""

    @property
    def rollout_path(self) -> str:
        """The weights the rollout engines start from: a resumed checkpoint's, else the policy's."""
        return self.policy_path if self.resumed is None else str(self.resumed.folder)


def start(
    config: GRPOConfig,
    run_dir: Path,
    *,
    load_split: bool = True,
    check_placement: Callable[[Placement], None] | None = None,
) -> RunStart:
    """The plan and everything the workers need. ``check_placement`` refuses what the pipeline
    cannot drive on this placement, before any model or data work."""
    from mindspeed_rl.utils.ray_setup import live_cluster

    plan = build_run_plan(config)
    # Per-role environments: probed in their own interpreters before Ray work or any model load.
    env_reports = check_plan_envs(plan)
    resumed = ckpt.resume_point(plan)  # a foreign checkpoint is refused first
    placement = plan.check_fits(live_cluster(plan.placement.device_kind))
    if check_placement is not None:
        check_placement(placement)
    policy_path = str(prepare_policy_model(plan.model, plan.warmup))
    return RunStart(
        plan=plan,
        run_dir=run_dir,
        resumed=resumed,
        placement=placement,
        policy_path=policy_path,
        splits=load_run_split(
            plan.data, policy_path, run_dir, streamed=streams_from_files(plan.data, window_of(plan))
        )
        if load_split
        else None,
        env_reports=env_reports,
    )


def window_of(plan: RunPlan) -> int | None:
    """``asp_config.window`` of an async run (None: the whole-run schedule)."""
    return None if plan.asp is None else plan.asp.window


def checkpointer(
    run: RunStart,
    schedule: Sequence[ScheduledMinibatch],
    *,
    extra_files: tuple[Path, ...] = (),
    hold_iteration: int | None = None,
) -> ckpt.Checkpointer:
    """The run's checkpointer over its lineage: ``schedule`` for a fresh run, the checkpoint's
    for a resumed one. ``hold_iteration``: crash tests only."""
    lineage = ckpt.Lineage(schedule, run.resumed, run.run_dir / ckpt.CONSUMED_LOG)
    return ckpt.Checkpointer(
        spec=run.plan.checkpoint,
        run_dir=run.run_dir,
        fingerprint=ckpt.run_fingerprint(run.plan),
        lineage=lineage,
        extra_files=extra_files,
        hold_iteration=hold_iteration,
    )


def finish(run_dir: Path, lineage: ckpt.Lineage) -> None:
    """After the pipeline wrote ``summary.json``: add the lineage's counts to it, then write the
    plots and print the end-of-run block (``run_end``)."""
    from mindspeed_rl.tools.run_summary import add_tool_summary

    ckpt.add_lineage_summary(run_dir, lineage)
    add_tool_summary(run_dir)
    run_end.report_run_end(run_dir)
