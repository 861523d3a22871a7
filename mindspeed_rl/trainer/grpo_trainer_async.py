"""The asynchronous ASP pipeline: Generation Units roll out in the ASP order while the trainer trains.

    ASP schedule ─► ControlUnit ─► GU 0..G-1 (actors: reload newest ─► generate) ─┐
                        ▲  Training Queue ◄──── completed minibatches ◄──────────┘
                        │        │ wait_global_batch(step)
                        │        ▼
                        └── TrainingUnit.train_step ─► export snapshot v=step+1 (background write)

Same CLI and YAML as the hybrid loop; ``rl_config.pipeline: async`` picks this schedule. The
trainer's idle time is the time spent waiting for a global batch (``time/trainer_wait_s``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.trainer import async_setup as setup
from mindspeed_rl.trainer import components
from mindspeed_rl.utils.metrics import MetricsWriter, format_progress
from mindspeed_rl.utils.run_summary import write_summary

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.runtime.records import GlobalBatch, ScheduledMinibatch
    from mindspeed_rl.sim.replay import ReplayPlan

logger = logging.getLogger(__name__)
CONSOLE_KEYS = (
    "reward_mean",
    "tokens_per_s",
    "time/trainer_wait_s",
    "lag/d_off_max",
    "queue/depth_samples_max",
)
# The driver blocks in the CU until its batch is ready, waking this often to check that the GUs
# are alive (a dead GU's work is re-queued only once the driver has declared it failed).
GU_CHECK_SECONDS = 0.5


def train(config: GRPOConfig, run_dir: Path, *, replay: ReplayPlan | None = None) -> None:
    """One async run. ``replay`` (trace replay, ``cli/replay_trace.py``) supplies the prompts, the
    schedule and every sample's forced length, and makes the trainer step a fixed sleep."""
    import ray

    from mindspeed_rl.utils.ray_setup import ray_actor_options
    from mindspeed_rl.workers.control_unit import ControlUnit
    from mindspeed_rl.workers.training_unit import TrainingUnit

    a = config.async_config
    policy_path = str(components.prepare_policy_model(config))
    records, schedule = _plan(config, policy_path, run_dir, replay)
    setup.check_resources(config, ray.available_resources())
    prompts = ray.put({r.prompt_id: r for r in records})
    control = ray_actor_options(a.control_resources)
    cu: Any = (
        ray.remote(ControlUnit)
        .options(**control, max_concurrency=32)
        .remote(setup.runtime_config(config), schedule)
    )
    tu: Any = (
        ray.remote(TrainingUnit)
        .options(**ray_actor_options(a.trainer_resources))
        .remote(
            config,
            policy_path,
            prompts,
            num_cpus=a.trainer_resources.num_cpus,
            simulated_step_seconds=None if replay is None else replay.step_seconds,
        )
    )
    forced = None if replay is None else replay.forced_lengths
    gus = _start_gus(config, policy_path, prompts, cu, setup.snapshot_root(config, run_dir), forced)
    # Engine start-up is not part of any iteration's time (as in the hybrid loop).
    root = setup.snapshot_root(config, run_dir) / "trainer"
    ray.get(
        [
            tu.enable_snapshots.remote(str(root), a.snapshot_keep),
            *[g.start_actors.remote() for g in gus.values()],
        ]
    )
    ray.get(cu.start.remote())
    runs = {gu.run.remote(): gu_id for gu_id, gu in gus.items()}
    num_iters = config.megatron_training.training.train_iters
    started = time.perf_counter()
    with MetricsWriter(run_dir, use_tensorboard=config.rl_config.use_tensorboard) as sink:
        for step in range(num_iters):
            export = step + 1 < num_iters and (step + 1) % a.snapshot_interval == 0
            record = _iteration(step, cu, tu, runs, export=export)
            logger.info(format_progress(sink.write(step, record), num_iters, CONSOLE_KEYS))
            _maybe_save(config, run_dir, step, tu)
    pipeline_seconds = time.perf_counter() - started
    control_cpu = _control_plane_cpu(cu, {g: gus[g] for g in runs.values()}, pipeline_seconds)
    _stop_gus(gus, runs)
    summary: dict[str, Any] = {**ray.get(cu.summary.remote()), **control_cpu}
    _write_events(run_dir, ray.get(cu.event_records.remote()))
    ray.get(tu.finish_snapshots.remote())
    ray.get(tu.save_hf.remote(str(run_dir / "final_model")))
    write_summary(
        run_dir, pipeline="async", queue_limit_samples=summary.pop("queue_limit_samples"), **summary
    )
    for handle in (cu, tu, *gus.values()):
        ray.kill(handle)


def _plan(
    config: GRPOConfig, policy_path: str, run_dir: Path, replay: ReplayPlan | None
) -> tuple[list[PromptRecord], tuple[ScheduledMinibatch, ...]]:
    if replay is None:
        prompt_set = components.load_prompt_set(config, components.load_tokenizer(policy_path))
        records = setup.run_prompts(config, prompt_set.records)
        return records, setup.build_schedule(config, records, run_dir)
    expected = config.megatron_training.training.train_iters * config.global_batch_prompts
    if len(replay.prompts) != expected:
        raise ValueError(
            f"the replay schedules {len(replay.prompts)} prompts but train_iters x global batch is {expected}; "
            "set megatron_training.train_iters to the replay's number of global batches"
        )
    return list(replay.prompts), tuple(replay.schedule)


def _start_gus(
    config: GRPOConfig,
    policy_path: str,
    prompts: Any,
    cu: Any,
    snapshots: Path,
    forced_lengths: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[int, Any]:
    import ray

    from mindspeed_rl.utils.ray_setup import ray_actor_options
    from mindspeed_rl.workers.generation_unit import GenerationUnit

    options = ray_actor_options(config.async_config.control_resources)
    remote = ray.remote(GenerationUnit).options(**options, max_concurrency=4)
    faults = setup.fault_plan(os.environ)
    specs = setup.gu_specs(config, policy_path, prompts, snapshots, faults, forced_lengths=forced_lengths)
    return {spec.gu_id: remote.remote(spec, cu) for spec in specs}


def _iteration(step: int, cu: Any, tu: Any, runs: dict[Any, int], *, export: bool) -> dict[str, float]:
    import ray

    start = time.perf_counter()
    batch = _wait_for_batch(step, cu, runs)
    waited = time.perf_counter() - start
    stats = ray.get(tu.train_step.remote(batch.prompts))
    train_s = time.perf_counter() - start - waited
    copy_s = ray.get(tu.export_snapshot.remote(step + 1, notify=cu)) if export else 0.0
    ray.get(cu.on_train_step_done.remote(step))
    pipeline = ray.get(cu.step_metrics.remote())
    total = time.perf_counter() - start
    return {
        **stats,
        **pipeline,
        "iteration_time_s": total,
        "tokens_per_s": stats["num_response_tokens"] / total,
        "time/trainer_wait_s": waited,
        "time/train_s": train_s,
        "time/snapshot_copy_s": copy_s,
        "trainer_idle_fraction": waited / total,
    }


def _wait_for_batch(step: int, cu: Any, runs: dict[Any, int]) -> GlobalBatch:
    import ray

    while True:
        batch = ray.get(cu.wait_global_batch.remote(step, GU_CHECK_SECONDS))
        if batch is not None:
            return batch
        _reap_gus(cu, runs)


def _reap_gus(cu: Any, runs: dict[Any, int]) -> None:
    """Declare GUs whose control loop ended (crash or no actors left) failed, so the CU re-issues
    their work; raise when no GU is left to generate."""
    import ray

    done, _ = ray.wait(list(runs), num_returns=len(runs), timeout=0)
    for ref in done:
        gu_id = runs.pop(ref)
        try:
            logger.warning("GU %d stopped early: %s", gu_id, ray.get(ref))
        except ray.exceptions.RayActorError:
            logger.error("GU %d died", gu_id)
        except ray.exceptions.RayTaskError:
            logger.exception("GU %d failed", gu_id)
        ray.get(cu.on_gu_failed.remote(gu_id))
    if not runs:
        raise RuntimeError("every Generation Unit stopped before the run finished; see the GU errors above")


def _control_plane_cpu(cu: Any, live_gus: Mapping[int, Any], seconds: float) -> dict[str, float]:
    """CPU the CU and the GU control loops used over the run: cores the engines did not get."""
    import ray

    cu_s = ray.get(cu.cpu_seconds.remote())
    gu_s = sum(ray.get([gu.cpu_seconds.remote() for gu in live_gus.values()]))
    return {
        "pipeline_seconds": seconds,
        "cu_cpu_seconds": cu_s,
        "gu_control_cpu_seconds": gu_s,
        "control_plane_cores": (cu_s + gu_s) / seconds,
    }


def _stop_gus(gus: dict[int, Any], runs: dict[Any, int]) -> None:
    import ray

    for gu in gus.values():
        gu.stop.remote()
    ray.wait(list(runs), num_returns=len(runs), timeout=60)
    ray.get([gus[g].shutdown.remote() for g in runs.values()])


def _write_events(run_dir: Path, records: list[dict[str, Any]]) -> None:
    with (run_dir / "events.jsonl").open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)


def _maybe_save(config: GRPOConfig, run_dir: Path, iteration: int, tu: Any) -> None:
    import ray

    interval = config.megatron_training.training.save_interval
    if interval and (iteration + 1) % interval == 0:
        ray.get(tu.save_hf.remote(str(run_dir / "checkpoints" / f"iter_{iteration + 1:07d}")))
