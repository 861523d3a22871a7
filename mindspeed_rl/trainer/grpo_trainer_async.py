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

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mindspeed_rl.trainer import async_setup as setup
from mindspeed_rl.trainer import components
from mindspeed_rl.trainer.async_cluster import AsyncCluster
from mindspeed_rl.trainer.checkpoints import checkpoint_dir, is_save_iteration
from mindspeed_rl.trainer.pipeline_inputs import PipelineInputs
from mindspeed_rl.utils.metrics import MetricsWriter, format_progress

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig

logger = logging.getLogger(__name__)
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
    import ray

    policy_path = str(components.prepare_policy_model(config))
    inputs = inputs or setup.asp_inputs(config, policy_path, run_dir)
    setup.check_resources(config, ray.available_resources())
    cluster = AsyncCluster.start(config, policy_path, inputs, run_dir)
    num_iters = config.megatron_training.training.train_iters
    with MetricsWriter(run_dir, use_tensorboard=config.rl_config.use_tensorboard) as sink:
        for step in range(num_iters):
            start = time.perf_counter()
            batch = cluster.wait_for_batch(step)
            waited = time.perf_counter() - start
            stats = cluster.train(batch)
            trained = time.perf_counter() - start - waited
            # The last step's weights go to final_model, not to a GU that has nothing left to do.
            export = step + 1 < num_iters and (step + 1) % config.async_config.snapshot_interval == 0
            copy_s = cluster.export_snapshot(step + 1) if export else 0.0
            pipeline = cluster.step_done(step)
            record = iteration_record(stats, pipeline, start, waited, trained, copy_s)
            logger.info(format_progress(sink.write(step, record), num_iters, CONSOLE_KEYS))
            if is_save_iteration(config, step):
                cluster.save(checkpoint_dir(run_dir, step))
    cluster.close(run_dir)


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
