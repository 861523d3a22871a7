"""Upstream's alternating GRPO loop: generate → reward → ref/old log-probs → update → push weights.

    prompts ──► GenerationActor.generate_minibatch ──► TrainingUnit.train_step ──┐
       ▲                                                                         │
       └──────────── GenerationActor.load_weights ◄── TrainingUnit weights ◄─────┘

Every iteration is strictly on-policy: the rollout engine gets the new weights before the next
global batch is generated (``d_off`` = 0). The async pipeline (``grpo_trainer_async``) reuses the
same TrainingUnit and GenerationActor; only the schedule around them differs.

On GPU/NPU the two live in one process on the same devices (upstream's colocated hybrid,
``workers/colocation.ColocatedWorker``): the weight push is in-process, the engine sleeps while the
trainer runs and the training state named by ``offload_train_*`` goes to host while it generates.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.datasets.split import write_split_ids
from mindspeed_rl.runtime.records import CompletedMinibatch, PromptGroup, Sample, ScheduledMinibatch
from mindspeed_rl.trainer import checkpointing as ckpt
from mindspeed_rl.trainer import components
from mindspeed_rl.trainer.reporting import IterationReport
from mindspeed_rl.utils.run_summary import write_summary

if TYPE_CHECKING:
    from collections.abc import Mapping

    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.plan.build import RunPlan

CONSOLE_KEYS = ("reward_mean", "response_length_mean", "tokens_per_s", "iteration_time_s", "eval/accuracy")


def train(config: GRPOConfig, run_dir: Path) -> None:
    import ray

    from mindspeed_rl.plan.build import build_run_plan
    from mindspeed_rl.utils.ray_setup import live_cluster, reserve

    plan = build_run_plan(config)
    resumed = ckpt.resume_point(config, plan.checkpoint)  # a foreign checkpoint is refused first
    # Per node, before any model or data work; what fits no node would otherwise pend forever.
    placement = plan.check_fits(live_cluster(plan.placement.device_kind))
    if len(placement.generation_actors) != 1:
        raise ValueError(
            f"pipeline: hybrid drives one rollout engine, but the colocated placement has "
            f"{len(placement.generation_actors)} (the trainer's devices / generate_config infer TP x PP); "
            "multi-engine colocated hybrid is not implemented (issue 11, item 6): use pipeline: async"
        )
    policy_path = str(components.prepare_policy_model(config))
    splits = components.load_prompt_splits(config, components.load_tokenizer(policy_path))
    write_split_ids(run_dir / "split_ids.json", splits)
    prompts = {r.prompt_id: r for r in splits.train}
    batches = components.global_batches(config, list(prompts))
    lineage = ckpt.Lineage(ckpt.batches_as_schedule(batches), resumed, run_dir / ckpt.CONSUMED_LOG)
    _check_same_order(lineage, batches)
    saver = ckpt.Checkpointer(spec=plan.checkpoint, run_dir=run_dir,
                              fingerprint=ckpt.run_fingerprint(config), lineage=lineage)  # fmt: skip

    reserved = reserve(placement)
    rollout_path = policy_path if resumed is None else str(resumed.folder)
    trainer, actor = _start_workers(config, plan, reserved, (policy_path, rollout_path), prompts)
    # Engine start-up (model load, vLLM warm-up) is not part of any iteration's time.
    ray.get([trainer.__ray_ready__.remote(), actor.__ray_ready__.remote()])
    saver.restore(trainer, resumed)
    todo = batches[lineage.start_iteration :]  # deterministic draw: a resumed run skips the first N
    with IterationReport(run_dir, plan, splits.valid, CONSOLE_KEYS) as report:
        for iteration, prompt_ids in enumerate(todo, start=lineage.start_iteration):
            report.write(iteration, _iteration(iteration, prompt_ids, actor, trainer), trainer)
            lineage.record(iteration, prompt_ids)
            saver.maybe_save(iteration, trainer)
    ray.get(trainer.save_hf.remote(str(run_dir / "final_model")))
    reserved.release()
    write_summary(
        run_dir,
        pipeline="hybrid",
        prompts_scheduled=sum(len(b) for b in todo),
        prompts_consumed=sum(len(b) for b in todo),
        # Hybrid generation happens under the exact weights being trained: no lag, no queue.
        max_policy_lag_measured=0,
        max_queue_depth_samples=0,
        queue_limit_samples=None,
        training_layout=plan.trainer.layout_summary(),
    )
    ckpt.add_lineage_summary(run_dir, lineage)


def _start_workers(
    config: GRPOConfig, plan: RunPlan, reserved: Any, paths: tuple[str, str], prompts: Mapping[str, Any]
) -> tuple[Any, Any]:
    """(trainer, rollout) handles. CPU: two processes, the Training Unit and a generation actor.
    GPU/NPU: upstream's colocated hybrid, ONE process holding both on the same devices, switching
    phases with vLLM sleep / wake-up and the ``offload_train_*`` switches (``workers/colocation.py``;
    written for accelerators, not run here: no accelerator with vLLM was available)."""
    import ray

    from mindspeed_rl.plan.sections import colocated_offload
    from mindspeed_rl.workers.colocation import ColocatedWorker
    from mindspeed_rl.workers.generation_actor import GenerationActor
    from mindspeed_rl.workers.training_group import remote_training_unit

    policy_path, rollout_path = paths
    group = config.rl_config.actor_resource
    rank0 = reserved.trainer_rank_options(0, group)
    offload = colocated_offload(config)
    if offload is not None:
        if rollout_path != policy_path:
            raise ValueError(
                "resuming the colocated hybrid is not implemented; resume on the two-process form"
            )
        worker = ray.remote(ColocatedWorker).options(**rank0)
        both = worker.remote(plan.trainer, plan.rollout, policy_path, prompts, offload)
        return both, both
    trainer = remote_training_unit(
        plan.trainer,
        policy_path,
        prompts,
        rank_options=[reserved.trainer_rank_options(r, group) for r in range(plan.trainer.num_ranks)],
        group_options={"num_cpus": 0},
    )
    actor = (
        ray.remote(GenerationActor)
        .options(**reserved.generation_actor_options(0, group))
        .remote(plan.rollout, rollout_path, prompts)
    )
    return trainer, actor


def _check_same_order(lineage: ckpt.Lineage, batches: list[tuple[str, ...]]) -> None:
    """The hybrid loop redraws its batches from the config; they must be the checkpoint's."""
    if tuple(tuple(mb.prompt_ids) for mb in lineage.schedule) != tuple(batches):
        raise ValueError(
            "the global batches drawn from this config differ from the checkpoint's schedule "
            "(the data file's contents changed?); resume with the data the checkpoint was trained on"
        )


def _iteration(iteration: int, prompt_ids: tuple[str, ...], actor: Any, trainer: Any) -> dict[str, float]:
    import ray

    start = time.perf_counter()
    minibatch = ScheduledMinibatch(
        minibatch_id=iteration,
        prompt_ids=prompt_ids,
        batch_group_id=iteration,
        predicted_load=0.0,
        order_index=iteration,
    )
    completed: CompletedMinibatch = ray.get(actor.generate_minibatch.remote(minibatch))
    gen_s = time.perf_counter() - start
    stats: dict[str, float] = ray.get(trainer.train_step.remote(group_by_prompt(completed)))
    train_s = time.perf_counter() - start - gen_s
    if actor is trainer:  # colocated: the weights move inside the worker's process
        ray.get(actor.refresh.remote(iteration + 1))
    else:
        ray.get(actor.load_weights.remote(trainer.inference_weights.remote(), iteration + 1))
    total_s = time.perf_counter() - start
    return {
        **stats,
        "iteration_time_s": total_s,
        "tokens_per_s": stats["num_response_tokens"] / total_s,
        "time/generate_s": gen_s,
        "time/train_s": train_s,
        "time/weight_sync_s": total_s - gen_s - train_s,
        "generate_tokens_per_s": stats["num_response_tokens"] / gen_s,
    }


def group_by_prompt(completed: CompletedMinibatch) -> tuple[PromptGroup, ...]:
    """The minibatch's samples as whole prompt groups, in the minibatch's prompt order."""
    by_prompt: dict[str, list[Sample]] = {}
    for sample in completed.samples:
        by_prompt.setdefault(sample.prompt_id, []).append(sample)
    return tuple(
        PromptGroup(prompt_id=pid, minibatch_id=completed.minibatch_id, samples=tuple(samples))
        for pid, samples in by_prompt.items()
    )
