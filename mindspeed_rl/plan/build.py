"""The one mapping from the typed ``GRPOConfig`` to the narrow configs a run hands its parts.

    GRPOConfig ──build_run_plan──► RunPlan
                                    ├─ model       (policy folder, build-if-missing architecture)
                                    ├─ data        (prompt source, template, batch draw)
                                    ├─ trainer     TrainerSpec  ─► TrainingUnit
                                    ├─ rollout     RolloutSpec  ─► GenerationActor
                                    ├─ runtime / asp / async_spec   (async only)
                                    ├─ logging, evaluation, checkpoint, warmup, offload
                                    ├─ trainer_resources   (the trainer's configured Ray request)
                                    └─ placement   (devices/CPUs per rank and actor; ``check_fits`` places them per node)

``cli/check_config.py`` and both trainers call ``build_run_plan``, so every error the run would
raise from its configuration (layouts, lag/minibatch fit, unsupported keys) is raised by the
check too, before any model, data or scheduling work. After it, the run reads only the plan.
Every schema field is either read here or declared inert (``fields.opt(inert=...)``);
``tests/.../plan/test_build_coverage.py`` enforces it.

Torch-free: it builds plain dataclasses only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from mindspeed_rl.config_cls.grpo_config import InertKey
from mindspeed_rl.config_cls.resources import ActorResources
from mindspeed_rl.contracts import (
    DynamicSampling,
    EvalConfig,
    OffloadSpec,
    OldLogProbs,
    PartialRollout,
    RolloutSpec,
    TrainerSpec,
)
from mindspeed_rl.models.rewards.config import RewardConfig
from mindspeed_rl.plan import correction, dapo
from mindspeed_rl.plan import placement as placing
from mindspeed_rl.plan import sections as parts
from mindspeed_rl.plan.memory_section import MemoryPlan, memory_plan
from mindspeed_rl.plan.multi_turn import multi_turn_spec
from mindspeed_rl.runtime.config import RuntimeConfig
from mindspeed_rl.utils.logging_config import LoggingConfig
from mindspeed_rl.utils.placement import ClusterSpec, Placement, PlacementRequest, plan_placement
from mindspeed_rl.utils.role_envs import HYBRID_REFUSAL

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import ASPConfig, GRPOConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    path: str
    """HF folder of tokenizer + weights (``tokenizer_name_or_path``)."""
    initial_weights: str | None
    """``load`` with ``finetune: true``: the HF folder the policy and reference start from."""
    build_if_missing: bool
    name: str
    build_arch: Mapping[str, Any]
    """Architecture (+ init std) for ``create_tiny_model``; read only when the folder is absent."""
    build_seed: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSpec:
    data_path: str
    prompt_type: str
    map_keys: Mapping[str, str] | None
    valid_data_path: str | None
    """Held-out prompts file (its own eval set; split's valid weight must then be 0)."""
    max_prompt_length: int
    split: str
    shuffle: bool
    seed: int
    num_prompts_per_global_batch: int
    """Prompts of one generation batch (``global_batch_size``): the unit the run draws in."""
    train_iters: int
    """Trainer steps (iterations) of the run."""
    num_prompts_per_step: int
    """Prompts one trainer step trains: the generation batch, or with DAPO's dynamic sampling
    ``filter_groups_train_batch_size`` kept ones."""

    @property
    def generation_batches(self) -> int:
        """Generation batches the run draws for ``train_iters`` steps when nothing is filtered
        (the last may be trained only in part)."""
        return -(-self.train_iters * self.num_prompts_per_step // self.num_prompts_per_global_batch)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSpec:
    save_interval: int | None
    """Iterations between HF checkpoints; None = only the final model."""
    save_dir: str | None
    """Folder of the periodic checkpoints (``save``); None = <run dir>/checkpoints."""
    resume_dir: str | None = None
    """``load`` without ``finetune``: resume from the newest complete checkpoint in this folder."""
    save_optim: bool = True
    save_rng: bool = True
    load_optim: bool = True
    load_rng: bool = True

    def is_save_iteration(self, iteration: int) -> bool:
        """True after every ``save_interval``-th iteration (0-based ``iteration``)."""
        return bool(self.save_interval) and (iteration + 1) % (self.save_interval or 1) == 0

    def folder(self, run_dir: Path, iteration: int) -> Path:
        """Upstream's naming, ``<save>/iter_0000100`` after the 100th iteration."""
        root = Path(self.save_dir) if self.save_dir else run_dir / "checkpoints"
        return root / f"iter_{iteration + 1:07d}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPlan:
    pipeline: Literal["hybrid", "async"]
    run_dir: str
    model: ModelSpec
    data: DataSpec
    trainer: TrainerSpec
    rollout: RolloutSpec
    logging: LoggingConfig
    evaluation: EvalConfig
    checkpoint: CheckpointSpec
    runtime_env_path: str | None
    warmup: parts.WarmupSpec | None
    """SFT warm-up of a model this run builds (``model.build_if_missing``); None = none."""
    offload: OffloadSpec | None
    """The colocated hybrid's offload switches (GPU/NPU); None where trainer and rollout never
    share a device (CPU, or the async pipeline)."""
    trainer_resources: ActorResources
    """Each trainer rank's Ray request as configured; what a rank asks for where no placement
    bundle applies (CPU-only runs). Hybrid: ``rl_config.actor_resource``, the rollout actor's too."""
    placement: PlacementRequest
    """Devices and CPUs per trainer rank / generation actor / control actor (``check_fits`` places them)."""
    runtime: RuntimeConfig | None = None
    """Async only."""
    asp: ASPConfig | None = None
    """Async only: the scheduler section the run's schedule is built from (a plain copy)."""
    async_spec: parts.AsyncSpec | None = None
    """Async only."""
    memory: MemoryPlan | None = None
    """What the device-memory estimate needs (``plan.memory_section``); None when the YAML gives
    no model shape."""
    inert_keys: tuple[InertKey, ...] = ()
    """Keys the user set that have no effect in this plan (loader's list + plan-level ones)."""
    dynamic_sampling: DynamicSampling | None = None
    """DAPO's group filter (``rl_config.filter_groups_enable``); None = train on every group."""

    def check_fits(self, cluster: ClusterSpec | Mapping[str, float]) -> Placement:
        """Place every actor per node (``utils.placement``), or raise naming what is short: Ray
        would otherwise queue what fits no node forever. ``cluster`` is a node list (the live
        cluster: ``ray_setup.live_cluster``; ``check_config --cluster NxD``) or one node's resources.
        On a CPU-only run the torch backend's layout is checked too (full-replica generation
        actors); sharded actors are for accelerator backends."""
        if not isinstance(cluster, ClusterSpec):
            cluster = ClusterSpec.one_node(cluster, self.placement.device_kind)
        if self.async_spec is not None and self.placement.device_kind is None:
            parts.check_torch_backend_layout(self.async_spec)
        return plan_placement(self.placement, cluster)


def build_run_plan(config: GRPOConfig) -> RunPlan:
    """Every narrow config of the run; raises ``ValueError`` naming the key for anything refused."""
    parts.refuse_unsupported(config)
    is_async = config.rl_config.pipeline == "async"
    trainer = trainer_spec(config)
    plan = RunPlan(
        pipeline=config.rl_config.pipeline,
        run_dir=config.run_dir,
        model=model_spec(config),
        data=data_spec(config),
        trainer=trainer,
        rollout=rollout_spec(config),
        logging=parts.logging_config(config),
        evaluation=parts.eval_config(config),
        checkpoint=parts.checkpoint_spec(config),
        runtime_env_path=config.rl_config.runtime_env_path,
        warmup=parts.warmup_spec(config),
        offload=parts.colocated_offload(config),
        trainer_resources=trainer_resources(config),
        placement=placing.placement_request(config),
        memory=memory_plan(
            config,
            trainer,
            rollout_tensor_parallel_size(config),
            rollout_ep=rollout_expert_parallel(config, trainer),
        ),
        inert_keys=parts.plan_inert_keys(config),
        dynamic_sampling=dapo.dynamic_sampling(config),
    )
    if not is_async:
        if config.async_config.role_envs is not None:
            raise ValueError(HYBRID_REFUSAL)
        return plan
    return parts.with_async(plan, config, runtime_config(config))


def rollout_tensor_parallel_size(config: GRPOConfig) -> int:
    """TP of each rollout engine: the async actors' own, or the hybrid's ``infer_tensor_parallel_size``."""
    if config.rl_config.pipeline == "async":
        return config.async_config.actor_tensor_parallel_size
    return config.generate_config.infer_tensor_parallel_size


def rollout_expert_parallel(config: GRPOConfig, trainer: TrainerSpec) -> int:
    """Workers one engine's experts are spread over (vLLM: EP = TP x DP with expert parallelism
    on); 0 = split over TP. The colocated megatron hybrid's engines are one vLLM data-parallel
    group over the trainer's ranks (``workers/colocated_rank.py``), so its EP is every rank;
    an async actor or a lone engine has DP 1."""
    tp = rollout_tensor_parallel_size(config)
    if not parts.engine_keys(config).get("enable_expert_parallel"):
        return 0
    colocated = config.rl_config.pipeline == "hybrid" and trainer.megatron is not None
    colocated = colocated and parts.colocated_offload(config) is not None
    return trainer.num_ranks // tp * tp if colocated else tp


def runtime_config(config: GRPOConfig) -> RuntimeConfig:
    """The Control Unit's settings (``GRPOConfig.runtime_config``); its checks are THE queue/lag
    rules, which the loader already ran on an async config."""
    return config.runtime_config()


def model_spec(config: GRPOConfig) -> ModelSpec:
    t = config.actor_config.training
    path = config.megatron_training.training.tokenizer_name_or_path
    if not path:
        raise ValueError(
            "megatron_training.tokenizer_name_or_path is not set; point it at an HF model folder"
        )
    build = config.rl_config.build_model_if_missing
    named = t.model
    return ModelSpec(
        path=path,
        initial_weights=parts.initial_weights(config),
        build_if_missing=build,
        name=config.model_name or named or "",
        build_arch=parts.build_arch(config) if build else MappingProxyType({}),
        build_seed=config.megatron_training.training.seed,
    )


def data_spec(config: GRPOConfig) -> DataSpec:
    t = config.megatron_training.training
    if not t.data_path:
        raise ValueError(
            "megatron_training.data_path is not set; point it at JSONL/Parquet prompts or builtin:demo"
        )
    return DataSpec(
        data_path=t.data_path,
        prompt_type=t.prompt_type or "empty",
        map_keys=t.map_keys,
        valid_data_path=t.valid_data_path,
        max_prompt_length=config.rl_config.max_prompt_length,
        split=t.split,
        shuffle=not t.no_shuffle,
        seed=t.seed,
        num_prompts_per_global_batch=config.num_prompts_per_global_batch,
        train_iters=t.train_iters,
        num_prompts_per_step=config.num_prompts_per_step,
    )


def trainer_spec(config: GRPOConfig) -> TrainerSpec:
    rl = config.rl_config
    engine = parts.engine_config(config)
    steps = parts.optimizer_steps_per_iteration(config)
    old: OldLogProbs = correction.old_log_probs(config, steps)
    resources = config.async_config.trainer_resources if rl.pipeline == "async" else rl.actor_resource
    megatron = parts.megatron_layout(config)
    return TrainerSpec(
        megatron=megatron,
        num_ranks=placing.trainer_ranks(config, placing.device_kind(config)[0]).count if megatron else 1,
        engine=engine,
        reward=RewardConfig(
            verifier_function=rl.verifier_function,
            verifier_weight=rl.verifier_weight,
            verifier_parallel=rl.verifier_parallel,
            verifier_timeout=rl.verifier_timeout,
            overlong=dapo.overlong_penalty(config),
        ),
        reference_micro_batch_size=rl.ref_forward_micro_batch_size if engine.loss.needs_reference else None,
        # Upstream's integrated worker is its hybrid loop's; the async pipeline's trainer holds
        # its devices alone and keeps the reference there (no host copies on its critical path).
        offload_reference=rl.use_integrated_worker and rl.pipeline == "hybrid",
        temperature=config.generate_config.sampling_config.temperature,
        n_samples_per_prompt=rl.n_samples_per_prompt,
        adv_estimator=rl.adv_estimator,
        old_log_probs=old,
        num_cpus=resources.num_cpus,
        routing_replay=rl.routing_replay,
    )


def rollout_spec(config: GRPOConfig) -> RolloutSpec:
    rl = config.rl_config
    resources = config.async_config.actor_resources if rl.pipeline == "async" else rl.actor_resource
    sampling = dapo.dynamic_sampling(config)
    decode = parts.sampling(config)
    return RolloutSpec(
        backend=rl.rollout_backend,
        engine_keys=parts.engine_keys(config),
        sampling=decode,
        n_samples_per_prompt=rl.n_samples_per_prompt,
        num_cpus=resources.num_cpus,
        seed=config.megatron_training.training.seed,
        filter_scorer=None if sampling is None else sampling.scorer,
        partial=partial_rollout(config, decode.max_tokens),
        multi_turn=multi_turn_spec(config, decode.max_tokens),
        record_routing=rl.routing_replay == "R3",
    )


def partial_rollout(config: GRPOConfig, max_tokens: int) -> PartialRollout | None:
    rl = config.rl_config
    # Read whatever the pipeline: the plan is the one reader of every key (test_build_coverage).
    chunk = rl.partial_rollout_chunk_tokens or PartialRollout.auto_chunk(max_tokens)
    if rl.pipeline != "async" or rl.partial_rollout_max_split <= 1:
        return None
    return PartialRollout(max_split=rl.partial_rollout_max_split, chunk_tokens=chunk)


def trainer_resources(config: GRPOConfig) -> ActorResources:
    rl = config.rl_config
    return parts.resources(
        config.async_config.trainer_resources if rl.pipeline == "async" else rl.actor_resource
    )
