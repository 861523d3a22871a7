"""``rl_config``: the GRPO algorithm, rewards, logging and the pipeline toggle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mindspeed_rl.config_cls.fields import opt, section
from mindspeed_rl.config_cls.resources import ActorResources

_NOT_IMPLEMENTED = "accepted for upstream compatibility; not implemented by this framework (no effect)"
_PERF_ONLY = (
    "upstream performance switch; both engines pad each micro-batch to its own longest sample (same results)"
)
_GROUP_NORM = "group_norm advantages are (r - group mean) / group std per prompt; GAE keys do not apply"
_NO_CRITIC = "GRPO has no critic"
_UPSTREAM_WORKERS = "upstream worker-layout switch; this framework's pipelines decide the layout"
_DISPATCH = (
    "upstream's per-stage data-dispatch granularity; the data path here hands each stage its whole "
    "batch (micro-batch sizes are actor_config.micro_batch_size and rl_config.*_forward_micro_batch_size)"
)
_TRANSFER = "upstream's inter-worker data transport; batches travel between this framework's actors over Ray"
_SWANLAB = (
    "SwanLab is not wired; metrics go to metrics.jsonl, TensorBoard (use_tensorboard) and W&B (use_wandb)"
)
_MULTIMODAL = "multimodal models are not supported: the policy is a text-only Qwen model"
_PPO = (
    "PPO with a critic is not supported: this framework trains GRPO (group_norm advantages, no value model)"
)
_LORA = "LoRA is not supported: the policy trains all of its weights"


@dataclass(frozen=True, slots=True, kw_only=True)
class IntegratedModeConfig:
    """Upstream's integrated (actor + reference in one worker) options."""

    ref_model_load_path: str | None = opt(
        None,
        "Weights the reference loads on a resume.",
        inert=(
            "the reference is always the initial policy (tokenizer_name_or_path, or load with finetune), "
            "on a resume too"
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RLConfig:
    """GRPO and run-level keys. Units: mini_batch_size in PROMPTS, *_micro_batch_size in SAMPLES."""

    pipeline: Literal["hybrid", "async"] = opt(
        "hybrid", "hybrid = upstream's alternating loop; async = ASP pipeline (asp_config, async_config)."
    )
    colocate: bool = opt(
        False,
        "CPU hybrid: run the rollout engine inside the trainer's process (megatron: one engine rank "
        "per trainer rank, vLLM's external launcher), without sleep mode, the layout GPU/NPU hybrids "
        "always use; false keeps trainer and rollout engine in two processes on CPU.",
    )
    rollout_backend: Literal["vllm", "hf"] = opt("vllm", "Rollout engine: vLLM (CPU/GPU/NPU) or HF generate.")
    build_model_if_missing: bool = opt(
        False,
        "Create a random-init HF model (architecture from `model:`) at "
        "megatron_training.tokenizer_name_or_path when that folder does not exist.",
    )
    n_samples_per_prompt: int = opt(1, "Responses per prompt (GRPO group size); >= 2 for group_norm.")
    mini_batch_size: int = opt(
        0,
        "PROMPTS per optimizer step; 0, or more than one iteration trains (global_batch_size, or "
        "filter_groups_train_batch_size with dynamic sampling) = one step per iteration, as upstream.",
    )
    epochs: int = opt(1, "Passes over each global batch.")
    shuffle_mini_batch: bool = opt(False, "Shuffle samples before splitting into mini-batches.")
    actor_forward_micro_batch_size: int = opt(1, "SAMPLES per micro-batch of the old-log-prob pass.")
    ref_forward_micro_batch_size: int = opt(1, "SAMPLES per micro-batch of the reference pass.")
    max_prompt_length: int = opt(2048, "Prompt tokens; longer prompts are dropped (and counted).")
    adv_estimator: Literal["group_norm"] = opt("group_norm", "Advantage estimator (GRPO).")
    kl_penalty: Literal["kl", "abs", "mse", "low_var_kl"] = opt(
        "low_var_kl", "KL estimator between actor and reference (low_var_kl = clipped k3)."
    )
    kl_ctrl_type: Literal["fixed", "adaptive"] = opt(
        "fixed",
        "KL coefficient controller; adaptive (PPO's): coef *= 1 + clip(kl / kl_target - 1, +-0.2) "
        "x samples / kl_horizon after every iteration (needs kl_target and kl_horizon).",
    )
    init_kl_coef: float = opt(0.001, "KL coefficient (start value when adaptive); 0 = no KL, no reference.")
    kl_target: float | None = opt(None, "Adaptive KL target (per-token KL).")
    kl_horizon: int | None = opt(None, "Adaptive KL horizon (samples).")
    use_kl_in_reward: bool = opt(
        False,
        "Subtract coef x (sum of per-token KL of the response) from the reward before advantages; "
        "the loss then has no KL term.",
    )
    clip_ratio: float = opt(0.2, "PPO ratio clip epsilon.")
    clip_higher_enable: bool = opt(
        False, "Asymmetric clip (DAPO): ratio clamped to [1 - clip_ratio_low, 1 + clip_ratio_high]."
    )
    clip_ratio_low: float = opt(0.2, "Lower clip epsilon when clip_higher_enable.")
    clip_ratio_high: float = opt(0.28, "Upper clip epsilon when clip_higher_enable.")
    token_level_loss: bool = opt(
        True,
        "true: token-mean over the mini-batch; false: each response's token-mean, then the mean over "
        "the mini-batch's responses.",
    )
    entropy_coeff: float = opt(0.0, "Entropy bonus weight.")
    gamma: float = opt(1.0, "Discount.", inert=_GROUP_NORM)
    lam: float = opt(0.95, "GAE lambda.", inert=_GROUP_NORM)
    cliprange_value: float = opt(0.5, "Critic value clip.", inert=_NO_CRITIC)
    advantage_whiten: bool = opt(True, "Whiten advantages.", inert=_GROUP_NORM)
    rule_reward: bool = opt(True, "Rewards come from rule verifiers.")
    verifier_function: tuple[str, ...] = opt((), "Verifier names (registry); unknown names are errors.")
    verifier_weight: tuple[float, ...] = opt((), "One weight per verifier_function entry.")
    verifier_parallel: int = opt(1, "Processes for verification.")
    verifier_timeout: float = opt(30.0, "Seconds before a verification counts as failed.")
    use_tensorboard: bool = opt(True, "Write TensorBoard events to the run directory.")
    use_wandb: bool = opt(False, "Log to Weights & Biases.")
    wandb_project: str | None = opt(None, "W&B project.")
    wandb_exp_name: str | None = opt(None, "W&B run name.")
    wandb_save_dir: str | None = opt(None, "W&B local folder.")
    actor_resource: ActorResources = section(ActorResources, "Actor (trainer) worker request.")
    reference_resource: ActorResources = section(
        ActorResources,
        "Reference worker (non-integrated).",
        inert="the reference runs inside the Training Unit (actor_resource)",
    )
    reward_resource: ActorResources = section(
        ActorResources, "Reward-model worker.", inert="rule rewards are scored inside the Training Unit"
    )
    critic_resource: ActorResources = section(ActorResources, "Critic worker.", refused=_PPO)
    runtime_env_path: str | None = opt(
        None, "Ray runtime_env YAML (env_vars); null = the repository's configs/envs/runtime_env.yaml."
    )
    use_integrated_worker: bool = opt(
        True,
        "Upstream's integrated worker (pipeline: hybrid): the reference's weights live on the host except "
        "during its log-prob pass (onloaded before it, offloaded after), as upstream's does; false keeps them "
        "on the device (the reference always runs inside the Training Unit here). pipeline: async keeps them "
        "on its trainer's own devices either way.",
    )
    blocking: bool = opt(True, "Upstream stage blocking.", inert=_UPSTREAM_WORKERS)
    guarantee_order: bool = opt(False, "Upstream result ordering.", inert=_UPSTREAM_WORKERS)
    num_cpus_for_local_task: float = opt(1.0, "Upstream driver-task CPUs.", inert=_UPSTREAM_WORKERS)
    num_cpus_for_placement_group: float = opt(8.0, "Upstream bundle CPUs.", inert=_UPSTREAM_WORKERS)
    use_remove_padding: bool = opt(False, "Packed sequences.", inert=_PERF_ONLY)
    use_dynamic_bsz: bool = opt(False, "Token-budget micro-batches.", inert=_PERF_ONLY)
    max_packing_token_size: int | None = opt(None, "Token budget for use_dynamic_bsz.", inert=_PERF_ONLY)
    partial_rollout_max_split: int = opt(
        1,
        "Async pipeline: a response may continue across at most N-1 weight refreshes (N segments); "
        "1 = every response finishes on the weights it started with.",
        refused=(
            "partial rollouts are not supported in the hybrid loop (an iteration generates under the "
            "exact weights it trains, so no refresh reaches a generation); they need rl_config.pipeline: async"
        ),
        accepts=lambda value, rl: rl.pipeline == "async",
    )
    partial_rollout_chunk_tokens: int | None = opt(
        None,
        "Partial rollouts (not an upstream key): new tokens per response between two checks for a "
        "newer snapshot; null = a quarter of sampling_config.max_tokens.",
    )
    routing_replay: Literal["R2", "R3"] | None = opt(
        None,
        "MoE routing replay (not an upstream key): R3 = every trainer forward (log-prob recompute, "
        "reference, update) routes each token through the experts the rollout engine chose; R2 = the "
        "update replays the routing of the trainer's own log-prob recompute; null = routers choose.",
    )
    require_max_age_all_finished: bool = opt(
        True,
        "Upstream partial rollouts: finish responses at their maximum age.",
        inert="a partial response here always finishes in the minibatch it started in; "
        "partial_rollout_max_split bounds its segments",
    )
    async_engine: bool = opt(False, "Streaming per-request generation.", inert=_NOT_IMPLEMENTED)
    data_strategy: str | None = opt(None, "Upstream data-transfer strategy.", inert=_NOT_IMPLEMENTED)
    log_max_throughput: bool = opt(False, "Upstream throughput metric variant.", inert=_NOT_IMPLEMENTED)
    # DAPO (stage: ray_dapo, cli/train_dapo.py): clip-higher and token-level loss are the keys
    # above; these two switches add the overlong penalty (rewards) and dynamic sampling (both
    # pipelines: groups whose filter metric has no spread are dropped, more prompts are generated).
    overlong_buffer_enable: bool = opt(False, "DAPO overlong-response penalty in the reward.")
    overlong_buffer: int = opt(
        0, "Tokens before rollout_max_tokens over which the penalty ramps (> 0 when enabled)."
    )
    overlong_buffer_penalty_factor: float = opt(1.0, "Penalty at rollout_max_tokens.")
    rollout_max_tokens: int = opt(2048, "Response length the overlong penalty counts to.")
    filter_groups_enable: bool = opt(False, "DAPO dynamic sampling: train only on groups with reward spread.")
    filter_groups_metric: str = opt(
        "acc", "Verifier (one of verifier_function) whose spread over a group keeps the group."
    )
    filter_groups_max_batches: int = opt(
        1, "Generation batches one trainer step may use before the run stops (-1 = no limit)."
    )
    filter_groups_train_batch_size: int = opt(
        1,
        "Kept prompts each trainer step (iteration) trains on; generation runs in batches of "
        "global_batch_size prompts, so a smaller value trains several steps on one generation batch.",
    )
    # Multi-turn rollouts with tools (upstream's keys and defaults; docs/guides/multi_turn_tools.md).
    multi_turn_enable: bool = opt(
        False,
        "Multi-turn rollouts: the model may call the tools of tool_config_path between turns; "
        "tool responses stay in the context but are masked out of the loss.",
    )
    tool_config_path: str | None = opt(
        None, "Tool YAML (upstream's shape: tools: [{class_name, config, tool_schema}]); relative to the cwd."
    )
    max_tool_calls: int = opt(0, "Tool calls one response may make (>= 1 when multi_turn_enable).")
    max_parallel_calls: int = opt(
        0, "Calls of one turn run concurrently (>= 1 when multi_turn_enable); further calls get an error."
    )
    max_total_response_length: int = opt(
        0,
        "Tokens of a whole response, model turns and tool responses together; 0 = sampling_config.max_tokens.",
    )
    max_tool_response_length: int = opt(0, "Tokens of one tool response after truncation; 0 = no cap.")
    tool_response_truncate_side: Literal["left", "right", "middle"] | None = opt(
        None, "Which part of a long tool response is cut (left keeps its end); null = middle."
    )
    tool_parser_format: str | None = opt(
        None, "Tool-call syntax (registered parsers: hermes); null = hermes."
    )
    tool_call_timeout: float | None = opt(
        None,
        "Seconds one tool call may take (queueing included) before it is answered with an error and its "
        "trajectory goes on; null = 120.",
    )
    is_multimodal: bool = opt(False, "Image/video prompts.", refused=_MULTIMODAL)
    reuse_image_embeds: bool = opt(False, "Reuse vision-encoder outputs.", refused=_MULTIMODAL)
    colocate_actor_and_vit: bool = opt(False, "Vision encoder on the actor's devices.", refused=_MULTIMODAL)
    vit_resource: ActorResources | None = opt(None, "Vision-encoder worker request.", refused=_MULTIMODAL)
    vit_forward_micro_batch_size: int | None = opt(None, "Vision-encoder micro-batch.", refused=_MULTIMODAL)
    actor_image_embeds_dispatch_size: int | None = opt(None, "Image-embedding dispatch.", refused=_MULTIMODAL)
    share_backbone: bool = opt(
        False,
        "Actor and reference share one backbone (LoRA adapters on top).",
        refused=f"{_LORA}, so the reference has no backbone to share",
    )
    # Upstream performance and plumbing knobs this framework does not have.
    hccl_buffersize: int = opt(
        256,
        "HCCL buffer (MB) of upstream's NPU weight resharding.",
        inert=(
            "upstream's resharding buffer; weight refresh here does not use it (HCCL itself is sized by "
            "HCCL_BUFFSIZE in the Ray runtime_env)"
        ),
    )
    beta: float = opt(
        0.1,
        "Weight of reward-model scores against rule rewards.",
        inert="there is no reward model (reward_config is refused); rewards are the weighted verifiers",
    )
    num_samples_per_step: int = opt(
        1,
        "Upstream sample bookkeeping.",
        inert="batch sizes here are global_batch_size (prompts), mini_batch_size and micro_batch_size",
    )
    integrated_mode_config: IntegratedModeConfig | None = opt(
        None, "Integrated-worker options.", inert="the Training Unit hosts actor and reference together"
    )
    tp_split_expert: bool = opt(
        False,
        "Split experts over TP in upstream's rollout.",
        inert="vLLM shards experts by its own TP / expert-parallel settings (generate_config.enable_expert_parallel)",
    )
    use_dp_batch_balance: bool = opt(False, "Balance tokens over DP ranks.", inert=_PERF_ONLY)
    dynamic_max_batch_size: int | None = opt(None, "Cap of use_dynamic_bsz micro-batches.", inert=_PERF_ONLY)
    ref_dynamic_max_batch_size: int | None = opt(None, "Reference cap (use_dynamic_bsz).", inert=_PERF_ONLY)
    actor_dynamic_max_batch_size: int | None = opt(
        None, "Old-log-prob cap (use_dynamic_bsz).", inert=_PERF_ONLY
    )
    update_dynamic_max_batch_size: int | None = opt(None, "Update cap (use_dynamic_bsz).", inert=_PERF_ONLY)
    ref_max_packing_token_size: int | None = opt(None, "Reference token budget.", inert=_PERF_ONLY)
    actor_max_packing_token_size: int | None = opt(None, "Old-log-prob token budget.", inert=_PERF_ONLY)
    update_max_packing_token_size: int | None = opt(None, "Update token budget.", inert=_PERF_ONLY)
    actor_rollout_dispatch_size: int | None = opt(None, "Rollout dispatch.", inert=_DISPATCH)
    actor_logprob_dispatch_size: int | None = opt(None, "Old-log-prob dispatch.", inert=_DISPATCH)
    ref_dispatch_size: int | None = opt(None, "Reference dispatch.", inert=_DISPATCH)
    reward_dispatch_size: int | None = opt(None, "Reward dispatch.", inert=_DISPATCH)
    adv_dispatch_size: int | None = opt(None, "Advantage dispatch.", inert=_DISPATCH)
    actor_update_dispatch_size: int | None = opt(None, "Update dispatch.", inert=_DISPATCH)
    kl_dispatch_size: int | None = opt(None, "KL dispatch.", inert=_DISPATCH)
    dynamic_sampling_dispatch_size: int | None = opt(None, "Dynamic-sampling dispatch.", inert=_DISPATCH)
    critic_update_dispatch_size: int | None = opt(None, "Critic update dispatch.", inert=_DISPATCH)
    critic_value_dispatch_size: int | None = opt(None, "Critic value dispatch.", inert=_DISPATCH)
    transfer_queue_data_shard_num: int = opt(1, "TransferQueue shards.", inert=_TRANSFER)
    transfer_queue_data_shard_port_base: int | None = opt(None, "TransferQueue first port.", inert=_TRANSFER)
    zmq_communication: bool = opt(True, "ZeroMQ data transport.", inert=_TRANSFER)
    use_swanlab: bool = opt(False, "Log to SwanLab.", inert=_SWANLAB)
    swanlab_mode: str = opt("", "SwanLab mode.", inert=_SWANLAB)
    swanlab_project: str = opt("", "SwanLab project.", inert=_SWANLAB)
    swanlab_exp_name: str = opt("", "SwanLab run name.", inert=_SWANLAB)
    swanlab_save_dir: str = opt("", "SwanLab local folder.", inert=_SWANLAB)

    def mini_batch_prompts(self, step_prompts: int) -> int:
        """Prompts per optimizer step of an iteration that trains ``step_prompts``: 0, or a
        mini-batch larger than the iteration, is the whole iteration (one step), as upstream."""
        return min(self.mini_batch_size or step_prompts, step_prompts)
