"""``HybridCluster``: the Ray actors of one hybrid run behind plain calls, so the trainer reads as a schedule.

::

    HybridCluster.start(run, prompts)  ─► CPU: TrainingUnit + GenerationActor (two processes)
                                       ─► GPU/NPU, torch engine: one ColocatedWorker holding both on the same devices
                                       ─► GPU/NPU, megatron: a rank group, each rank a trainer rank
                                          and one TP rank of a rollout engine (ColocatedGroup)
    iteration(i, prompt_ids)           ─► generate ─► train_step ─► push the new weights to the rollout
    evaluate(request)                  ─► the rollout decodes held-out prompts, the trainer scores them
    close(run_dir)                     ─► final_model, summary.json, release the placement

Colocated, the engine sleeps while the trainer runs and the training state named by
``offload_train_*`` goes to host while it generates (``workers/colocation.py``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.runtime.records import CompletedMinibatch, PromptGroup, Sample, ScheduledMinibatch
from mindspeed_rl.utils.run_summary import write_summary

if TYPE_CHECKING:
    from mindspeed_rl.contracts import TrainerSpec
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.trainer.startup import RunStart
    from mindspeed_rl.utils.placement import Placement
    from mindspeed_rl.utils.ray_setup import ReservedPlacement
    from mindspeed_rl.workers.colocated_rank import EngineGrid
    from mindspeed_rl.workers.evaluator import EvalRequest


class HybridCluster:
    """The Training Unit and its rollout engine (the same actor when colocated); ``start`` blocks
    until both are up."""

    def __init__(self, trainer: Any, rollout: Any, reserved: ReservedPlacement, spec: TrainerSpec) -> None:
        self.trainer, self.rollout = trainer, rollout
        self._reserved, self._spec = reserved, spec
        self._prompts_trained = 0
        self._weights_version = 0  # pushed to the rollout engine
        self._evaluations = 0
        self.summary_extra: dict[str, Any] = {}
        """More summary.json fields from the loop (dynamic sampling's counts)."""

    @staticmethod
    def check_placement(placement: Placement) -> None:
        """Several rollout engines only colocated, in the trainer's rank processes (one trainer
        rank per device, ``colocated_rank.py``); the two-process form drives one engine."""
        engines = len(placement.generation_actors)
        if engines != 1 and not placement.request.colocated:
            raise ValueError(
                f"pipeline: hybrid without colocation drives one rollout engine, but the placement has "
                f"{engines}; colocate them (on GPU/NPU the hybrid is colocated) or use pipeline: async"
            )

    @classmethod
    def start(cls, run: RunStart, prompts: Mapping[str, PromptRecord]) -> HybridCluster:
        """CPU: two processes, the Training Unit and a generation actor. GPU/NPU (``plan.offload``
        set): upstream's colocated hybrid, ONE process holding both on the same devices, switching
        phases with vLLM sleep / wake-up and the ``offload_train_*`` switches (written for
        accelerators, not run here: no accelerator with vLLM was available)."""
        import ray

        from mindspeed_rl.utils.ray_setup import reserve
        from mindspeed_rl.workers.colocation import ColocatedWorker
        from mindspeed_rl.workers.generation_actor import GenerationActor
        from mindspeed_rl.workers.training_group import remote_training_unit

        plan = run.plan
        group = plan.trainer_resources  # hybrid: one request for the trainer and its rollout actor
        reserved = reserve(run.placement)
        if plan.offload is not None:
            # The engine starts from the rollout path (a resumed checkpoint's weights), the trainer
            # from the policy (the reference is the initial policy; its state is restored after).
            if plan.trainer.megatron is None:
                worker = ray.remote(ColocatedWorker).options(**reserved.trainer_rank_options(0, group))
                both = worker.remote(
                    plan.trainer,
                    plan.rollout,
                    run.policy_path,
                    prompts,
                    plan.offload,
                    rollout_path=run.rollout_path,
                )
            else:
                both, grid = start_colocated_group(run, reserved, prompts)
            cluster = cls(both, both, reserved, plan.trainer)
            engines, tp = (1, 1) if plan.trainer.megatron is None else (grid.engines, grid.tp)
            cluster.summary_extra["colocated_engines"] = {"engines": engines, "tp": tp}
        else:
            trainer = remote_training_unit(
                plan.trainer,
                run.policy_path,
                prompts,
                rank_options=[reserved.trainer_rank_options(r, group) for r in range(plan.trainer.num_ranks)],
                group_options={"num_cpus": 0},
            )
            rollout = (
                ray.remote(GenerationActor)
                .options(**reserved.generation_actor_options(0, group))
                .remote(plan.rollout, run.rollout_path, prompts)
            )
            cluster = cls(trainer, rollout, reserved, plan.trainer)
        # Engine start-up (model load, vLLM warm-up) is not part of any iteration's time.
        ray.get([cluster.trainer.__ray_ready__.remote(), cluster.rollout.__ray_ready__.remote()])
        return cluster

    # ---- one iteration ---------------------------------------------------------------------------
    def iteration(self, iteration: int, prompt_ids: tuple[str, ...]) -> dict[str, float]:
        """Generate the global batch, train on it, push the new weights; the iteration's record."""
        start = time.perf_counter()
        groups = self.generate(iteration, prompt_ids)
        return self.train_and_push(iteration, groups, gen_s=time.perf_counter() - start)

    def generate(self, iteration: int, prompt_ids: tuple[str, ...]) -> tuple[PromptGroup, ...]:
        """One generation batch under the current weights, as whole prompt groups."""
        import ray

        minibatch = ScheduledMinibatch(
            minibatch_id=iteration,
            prompt_ids=prompt_ids,
            batch_group_id=iteration,
            predicted_load=0.0,
            order_index=iteration,
        )
        completed: CompletedMinibatch = ray.get(self.rollout.generate_minibatch.remote(minibatch))
        return group_by_prompt(completed)

    def train_and_push(
        self, iteration: int, groups: tuple[PromptGroup, ...], *, gen_s: float
    ) -> dict[str, float]:
        """Train on ``groups`` (generated in ``gen_s`` seconds), push the new weights; the record."""
        import ray

        start = time.perf_counter()
        stats: dict[str, float] = ray.get(self.trainer.train_step.remote(groups))
        train_s = time.perf_counter() - start
        if self.rollout is self.trainer:  # colocated: the weights move inside the worker's process
            ray.get(self.rollout.refresh.remote(iteration + 1))
        else:
            ray.get(self.rollout.load_weights.remote(self.trainer.inference_weights.remote(), iteration + 1))
        self._weights_version = iteration + 1
        total_s = time.perf_counter() - start + gen_s
        self._prompts_trained += len(groups)
        record = {
            **stats,
            "iteration_time_s": total_s,
            "tokens_per_s": stats["num_response_tokens"] / total_s,
            "time/generate_s": gen_s,
            "time/train_s": train_s,
            "time/weight_sync_s": total_s - gen_s - train_s,
        }
        if gen_s > 0:  # a DAPO iteration may train groups an earlier iteration generated
            record["generate_tokens_per_s"] = stats["num_response_tokens"] / gen_s
        return record

    def evaluate(self, request: EvalRequest) -> dict[str, float]:
        """``eval/*`` metrics of the trainer's current weights: after ``train_and_push`` the
        rollout engine holds exactly them, so it decodes and the trainer scores."""
        import ray

        start = time.perf_counter()
        job = request.job(self._evaluations, min_version=self._weights_version)
        self._evaluations += 1
        decoded = self.rollout.decode_held_out.remote(job)
        metrics: dict[str, float] = ray.get(self.trainer.score_held_out.remote(request.prompts, decoded))
        return {**metrics, "time/eval_s": time.perf_counter() - start}

    # ---- teardown --------------------------------------------------------------------------------
    def close(self, run_dir: Path) -> None:
        """Save the final model, release the placement, write summary.json."""
        import ray

        ray.get(self.trainer.save_hf.remote(str(run_dir / "final_model")))
        if "colocated_engines" in self.summary_extra and self._spec.megatron is not None:
            ray.get(self.rollout.shutdown_engines.remote())  # every engine rank together
        self._reserved.release()
        write_summary(
            run_dir,
            pipeline="hybrid",
            prompts_scheduled=self._prompts_trained,
            prompts_consumed=self._prompts_trained,
            # Hybrid generation happens under the exact weights being trained: no lag, no queue.
            max_policy_lag_measured=0,
            max_queue_depth_samples=0,
            queue_limit_samples=None,
            training_layout=self._spec.layout_summary(),
            **self.summary_extra,
        )


def start_colocated_group(
    run: RunStart, reserved: ReservedPlacement, prompts: Mapping[str, PromptRecord]
) -> tuple[Any, EngineGrid]:
    """The ``ColocatedGroup`` actor over the planned trainer ranks, and its engines."""
    import functools

    import ray

    from mindspeed_rl.workers.colocated_rank import ColocatedGroup, ColocatedRank, EngineGrid, rank_group_spec

    plan = run.plan
    assert plan.offload is not None, "colocation is planned with its offload switches"
    grid = EngineGrid.of(plan.trainer.num_ranks, plan.rollout)
    grid.check_placement(run.placement)
    factory = functools.partial(
        ColocatedRank,
        plan.trainer,
        plan.rollout,
        run.policy_path,
        dict(prompts),
        plan.offload,
        grid,
        rollout_path=run.rollout_path,
    )
    group = (
        ray.remote(ColocatedGroup)
        .options(num_cpus=0)
        .remote(rank_group_spec(plan.trainer, plan.trainer_resources, reserved), factory)
    )
    return group, grid


def group_by_prompt(completed: CompletedMinibatch) -> tuple[PromptGroup, ...]:
    """The minibatch's samples as whole prompt groups, in the minibatch's prompt order."""
    by_prompt: dict[str, list[Sample]] = {}
    for sample in completed.samples:
        by_prompt.setdefault(sample.prompt_id, []).append(sample)
    return tuple(
        PromptGroup(prompt_id=pid, minibatch_id=completed.minibatch_id, samples=tuple(samples))
        for pid, samples in by_prompt.items()
    )
