"""Upstream's alternating GRPO loop: generate → reward → ref/old log-probs → update → push weights.

    prompts ──► GenerationActor.generate_minibatch ──► TrainingUnit.train_step ──┐
       ▲                                                                         │
       └──────────── GenerationActor.load_weights ◄── TrainingUnit weights ◄─────┘

Every iteration is strictly on-policy: the rollout engine gets the new weights before the next
global batch is generated (``d_off`` = 0). The async pipeline (``grpo_trainer_async``) reuses the
same TrainingUnit and GenerationActor; only the schedule around them differs. On GPU/NPU the two
live in one process on the same devices (upstream's colocated hybrid); every Ray detail is in
``hybrid_cluster``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mindspeed_rl.trainer import checkpointing as ckpt
from mindspeed_rl.trainer import oversampling, run_end, startup
from mindspeed_rl.trainer.hybrid_cluster import HybridCluster
from mindspeed_rl.trainer.hybrid_dapo import HybridDynamicSampling
from mindspeed_rl.trainer.iteration_report import IterationReport
from mindspeed_rl.trainer.prompts import global_batches

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig

CONSOLE_KEYS = ("reward_mean", "response_length_mean", "tokens_per_s", "iteration_time_s", "eval/accuracy")


def train(config: GRPOConfig, run_dir: Path) -> None:
    run = startup.start(config, run_dir, check_placement=HybridCluster.check_placement)
    assert run.splits is not None, "the hybrid loop always loads its prompts"
    prompts = {r.prompt_id: r for r in run.splits.train}
    sampling = run.plan.dynamic_sampling
    # Dynamic sampling draws further (the same stream): up to max_batches x the run's batches.
    batches = global_batches(oversampling.drawn_data(run.plan.data, sampling), list(prompts))
    saver = startup.checkpointer(run, ckpt.batches_as_schedule(batches))
    lineage = saver.lineage
    _check_same_order(lineage, batches)
    cluster = HybridCluster.start(run, prompts)
    saver.restore(cluster.trainer, run.resumed)
    # Deterministic draw: a resumed run skips the batches its lineage consumed (every iteration
    # consumes whole generation batches, one without dynamic sampling).
    todo = iter(batches[lineage.num_consumed // run.plan.data.num_prompts_per_global_batch :])
    dapo = HybridDynamicSampling(sampling) if sampling is not None else None
    with IterationReport(run_dir, run.plan, run.splits.valid, CONSOLE_KEYS) as report:
        for iteration in range(lineage.start_iteration, run.plan.data.train_iters):
            if dapo is None:
                prompt_ids = next(todo)
                record = cluster.iteration(iteration, prompt_ids)
            else:
                done = dapo.iteration(cluster, iteration, todo)
                record, prompt_ids = done.record, done.consumed_prompt_ids
            if (request := report.eval_request(iteration)) is not None:
                record.update(cluster.evaluate(request))  # on the rollout engine, just pushed to
            report.write(iteration, record)
            lineage.record(iteration, prompt_ids)
            if saver.maybe_save(iteration, cluster.trainer) is not None:
                run_end.plots_at_checkpoint(run_dir)
    if dapo is not None:
        cluster.summary_extra.update(dapo.summary())
    cluster.close(run_dir)
    startup.finish(run_dir, lineage)


def _check_same_order(lineage: ckpt.Lineage, batches: list[tuple[str, ...]]) -> None:
    """The hybrid loop redraws its batches from the data; they must be the checkpoint's."""
    if tuple(tuple(mb.prompt_ids) for mb in lineage.schedule) != tuple(batches):
        raise ValueError(
            "the global batches drawn from this config differ from the checkpoint's schedule "
            "(the data file's contents changed?); resume with the data the checkpoint was trained on"
        )
