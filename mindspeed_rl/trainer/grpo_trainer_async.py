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

from mindspeed_rl.trainer import online_asp, run_end, startup
from mindspeed_rl.trainer.async_cluster import AsyncCluster
from mindspeed_rl.trainer.async_inputs import PipelineInputs, RunHooks, run_inputs
from mindspeed_rl.trainer.iteration_report import IterationReport
from mindspeed_rl.trainer.run_schedule import SCHEDULE_FILE

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.plan.build import RunPlan

CONSOLE_KEYS = (
    "reward_mean",
    "tokens_per_s",
    "time/trainer_wait_s",
    "lag/d_off_max",
    "queue/depth_samples_max",
    "eval/accuracy",  # on the lines of iterations that evaluated
)


def train(
    config: GRPOConfig, run_dir: Path, inputs: PipelineInputs | None = None, hooks: RunHooks | None = None
) -> None:
    """One async run. ``inputs`` (a trace replay's, built in ``cli/``) replaces the prompts and
    schedule the run's split would give; ``hooks``: fault and crash tests only."""
    hooks = hooks or RunHooks()
    run = startup.start(config, run_dir, load_split=inputs is None)
    inputs = run_inputs(run, inputs)
    saver = startup.checkpointer(run, inputs.schedule, extra_files=(run_dir / SCHEDULE_FILE,),
                                 hold_iteration=hooks.checkpoint_hold_iteration)  # fmt: skip
    lineage, plan = saver.lineage, run.plan
    cluster = AsyncCluster.start(run, inputs, hooks.faults)
    saver.restore(cluster.tu, run.resumed)
    carry = plan.asp is not None and (plan.asp.online or inputs.window is not None)
    with IterationReport(run_dir, plan, inputs.held_out, CONSOLE_KEYS) as report:
        for step in range(lineage.start_iteration, plan.data.train_iters):
            if inputs.window is not None and (chunk := inputs.window.top_up(step)) is not None:
                cluster.extend_schedule(chunk)  # streaming: the window drained past half
            # The CU and the snapshot versions count this run's steps (v0 = the weights it started from).
            local = step - lineage.start_iteration
            # An evaluation due after this step decodes its snapshot (v local+1) on a rollout actor.
            # Submitted first: popping the run's last batch ends the GUs' work unless a job waits.
            evaluation = report.eval_request(step)
            job = cluster.submit_eval(evaluation, local + 1) if evaluation is not None else None
            start = time.perf_counter()
            batch = cluster.wait_for_batch(local)
            waited = time.perf_counter() - start
            stats = cluster.train(batch)
            trained = time.perf_counter() - start - waited
            exports = _exports_after(plan, step) or evaluation is not None
            copy_s = cluster.export_snapshot(local + 1) if exports else 0.0
            pipeline = cluster.step_done(local)
            lineage.record(step, batch.consumed_prompt_ids)  # dynamic sampling's dropped prompts too
            record = iteration_record(stats, pipeline, start, waited, trained, copy_s)
            if plan.dynamic_sampling is not None:
                record.update(batch.filter_metrics())
            if evaluation is not None and job is not None:  # the GUs generate on meanwhile
                record.update(cluster.eval_result(evaluation, job))
            report.write(step, record)
            if carry and saver.spec.is_save_iteration(step):
                # Online ASP / a window: the checkpoint carries the schedule as re-planned / drawn.
                lineage.schedule = online_asp.carry_schedule(lineage.schedule, cluster.current_schedule())
            if saver.maybe_save(step, cluster.tu) is not None:
                run_end.plots_at_checkpoint(run_dir)
    if carry:  # the summary counts the schedule as re-planned / drawn, not the one the run began with
        lineage.schedule = online_asp.carry_schedule(lineage.schedule, cluster.current_schedule())
    cluster.close(run_dir)
    startup.finish(run_dir, lineage)


def _exports_after(plan: RunPlan, step: int) -> bool:
    """Every ``snapshot_interval`` steps, except after the last one: its weights go to
    final_model, not to a GU that has nothing left to generate (an evaluation due then exports
    it anyway: the rollout actors decode it)."""
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
