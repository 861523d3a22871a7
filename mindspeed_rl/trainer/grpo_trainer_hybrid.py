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
from mindspeed_rl.trainer import startup
from mindspeed_rl.trainer.hybrid_cluster import HybridCluster
from mindspeed_rl.trainer.iteration_report import IterationReport
from mindspeed_rl.trainer.prompts import global_batches

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig

CONSOLE_KEYS = ("reward_mean", "response_length_mean", "tokens_per_s", "iteration_time_s", "eval/accuracy")


def train(config: GRPOConfig, run_dir: Path) -> None:
    run = startup.start(config, run_dir, check_placement=HybridCluster.check_placement)
    assert run.splits is not None, "the hybrid loop always loads its prompts"
    prompts = {r.prompt_id: r for r in run.splits.train}
    batches = global_batches(run.plan.data, list(prompts))
    saver = startup.checkpointer(run, ckpt.batches_as_schedule(batches))
    lineage = saver.lineage
    _check_same_order(lineage, batches)
    cluster = HybridCluster.start(run, prompts)
    saver.restore(cluster.trainer, run.resumed)
    todo = batches[lineage.start_iteration :]  # deterministic draw: a resumed run skips the first N
    with IterationReport(run_dir, run.plan, run.splits.valid, CONSOLE_KEYS) as report:
        for iteration, prompt_ids in enumerate(todo, start=lineage.start_iteration):
            report.write(iteration, cluster.iteration(iteration, prompt_ids), cluster.trainer)
            lineage.record(iteration, prompt_ids)
            saver.maybe_save(iteration, cluster.trainer)
    cluster.close(run_dir)
    startup.finish(run_dir, lineage)


def _check_same_order(lineage: ckpt.Lineage, batches: list[tuple[str, ...]]) -> None:
    """The hybrid loop redraws its batches from the data; they must be the checkpoint's."""
    if tuple(tuple(mb.prompt_ids) for mb in lineage.schedule) != tuple(batches):
        raise ValueError(
            "the global batches drawn from this config differ from the checkpoint's schedule "
            "(the data file's contents changed?); resume with the data the checkpoint was trained on"
        )
