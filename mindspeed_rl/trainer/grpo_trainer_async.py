"""The asynchronous ASP pipeline: Generation Units roll out in the ASP order while the trainer trains.

    ASP schedule ─► ControlUnit ─► GU 0..G-1 (actors: reload newest ─► generate) ─┐
                        ▲  Training Queue ◄──── completed minibatches ◄──────────┘
                        │        │ wait_for_batch(step)
                        │        ▼
                        └── TrainingUnit.train ─► export snapshot v=step+1 (background write)

Same CLI and YAML as the hybrid loop; ``rl_config.pipeline: async`` picks this schedule. The
overlap is the point: while step s trains, the GUs keep generating the batches of s+1, s+2, ...
under the lag bound, so the trainer's idle time is only the wait for its batch
(``time/trainer_wait_s``). Every Ray detail is in ``async_cluster``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from mindspeed_rl.plan.build import RunPlan, build_run_plan
from mindspeed_rl.trainer import async_setup as setup
from mindspeed_rl.trainer import checkpointing as ckpt
from mindspeed_rl.trainer import components
from mindspeed_rl.trainer.async_cluster import AsyncCluster
from mindspeed_rl.trainer.pipeline_inputs import PipelineInputs
from mindspeed_rl.trainer.reporting import IterationReport

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig

CONSOLE_KEYS = (
    "reward_mean",
    "tokens_per_s",
    "time/trainer_wait_s",
    "lag/d_off_max",
    "queue/depth_samples_max",
)


def train(config: GRPOConfig, run_dir: Path, inputs: PipelineInputs | None = None) -> None:
    """One async run. ``inputs`` (trace replay, fault tests; built in ``cli/``) replaces the
    prompts and schedule the config would give."""
    from mindspeed_rl.utils.ray_setup import live_cluster

    plan = build_run_plan(config)
    resumed = ckpt.resume_point(config, plan.checkpoint)  # a foreign checkpoint is refused first
    # Per node, on the live cluster, before any model, data or scheduling work.
    placement = plan.check_fits(live_cluster(plan.placement.device_kind))
    policy_path = str(components.prepare_policy_model(config))
    inputs = setup.run_inputs(config, policy_path, run_dir, inputs, resumed)
    lineage = ckpt.Lineage(inputs.schedule, resumed, run_dir / ckpt.CONSUMED_LOG)
    weights = None if resumed is None else str(resumed.folder)
    cluster = AsyncCluster.start(config, plan, placement, policy_path, inputs, run_dir, rollout_path=weights)
    saver = ckpt.Checkpointer(spec=plan.checkpoint, run_dir=run_dir, fingerprint=ckpt.run_fingerprint(config),
                              lineage=lineage, extra_files=(run_dir / setup.SCHEDULE_FILE,),
                              commit_delay_s=inputs.checkpoint_commit_delay_s)  # fmt: skip
    saver.restore(cluster.tu, resumed)
    with IterationReport(run_dir, plan, inputs.held_out, CONSOLE_KEYS) as report:
        for step in range(lineage.start_iteration, plan.data.train_iters):
            # The CU and the snapshot versions count this run's steps (v0 = the weights it started from).
            local = step - lineage.start_iteration
            start = time.perf_counter()
            batch = cluster.wait_for_batch(local)
            waited = time.perf_counter() - start
            stats = cluster.train(batch)
            trained = time.perf_counter() - start - waited
            copy_s = cluster.export_snapshot(local + 1) if _exports_after(plan, step) else 0.0
            pipeline = cluster.step_done(local)
            lineage.record(step, batch.prompt_ids)
            report.write(step, iteration_record(stats, pipeline, start, waited, trained, copy_s), cluster.tu)
            saver.maybe_save(step, cluster.tu)
    cluster.close(run_dir)
    ckpt.add_lineage_summary(run_dir, lineage)


def _exports_after(plan: RunPlan, step: int) -> bool:
    """Every ``snapshot_interval`` steps, except after the last one: its weights go to
    final_model, not to a GU that has nothing left to generate."""
    assert plan.async_spec is not None
    return step + 1 < plan.data.train_iters and (step + 1) % plan.async_spec.snapshot_interval == 0


def iteration_record(
    stats: dict[str, float],
    pipeline: dict[str, float],
    start: float,
    waited: float,
    trained: float,
    copy_s: float,
) -> dict[str, float]:
    total = time.perf_counter() - start
    return {
        **stats,
        **pipeline,
        "iteration_time_s": total,
        "tokens_per_s": stats["num_response_tokens"] / total,
        "time/trainer_wait_s": waited,
        "time/train_s": trained,
        "time/snapshot_copy_s": copy_s,
        "trainer_idle_fraction": waited / total,
    }
