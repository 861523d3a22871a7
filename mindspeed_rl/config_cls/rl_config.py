"""``rl_config``: the GRPO algorithm, rewards, logging and the pipeline toggle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mindspeed_rl.config_cls.fields import opt, section
from mindspeed_rl.config_cls.resources import ActorResources

_NOT_IMPLEMENTED = "accepted for upstream compatibility; not implemented by this framework (no effect)"
_PERF_ONLY = "upstream performance switch; the torch backend pads per micro-batch (same results)"
_GROUP_NORM = "group_norm advantages are (r - group mean) / group std per prompt; GAE keys do not apply"
_NO_CRITIC = "GRPO has no critic"
_UPSTREAM_WORKERS = "upstream worker-layout switch; this framework's pipelines decide the layout"


@dataclass(frozen=True, slots=True, kw_only=True)
class RLConfig:
    """GRPO and run-level keys. Units: mini_batch_size in PROMPTS, *_micro_batch_size in SAMPLES."""

    pipeline: Literal["hybrid", "async"] = opt(
        "hybrid", "hybrid = upstream's alternating loop; async = ASP pipeline (asp_config, async_config)."
    )
    rollout_backend: Literal["vllm", "hf"] = opt("vllm", "Rollout engine: vLLM (CPU/GPU/NPU) or HF generate.")
    build_model_if_missing: bool = opt(
        False,
        "Create a random-init HF model (architecture from `model:`) at "
        "megatron_training.tokenizer_name_or_path when that folder does not exist.",
    )
    n_samples_per_prompt: int = opt(1, "Responses per prompt (GRPO group size); >= 2 for group_norm.")
    mini_batch_size: int = opt(0, "PROMPTS per optimizer step; 0 = global_batch_size (one step).")
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
    critic_resource: ActorResources = section(ActorResources, "Critic worker.", inert=_NO_CRITIC)
    runtime_env_path: str | None = opt(
        None, "Ray runtime_env YAML (env_vars); null = the repository's configs/envs/runtime_env.yaml."
    )
    use_integrated_worker: bool = opt(True, "Actor and reference in one worker.", inert=_UPSTREAM_WORKERS)
    blocking: bool = opt(True, "Upstream stage blocking.", inert=_UPSTREAM_WORKERS)
    guarantee_order: bool = opt(False, "Upstream result ordering.", inert=_UPSTREAM_WORKERS)
    num_cpus_for_local_task: float = opt(1.0, "Upstream driver-task CPUs.", inert=_UPSTREAM_WORKERS)
    num_cpus_for_placement_group: float = opt(8.0, "Upstream bundle CPUs.", inert=_UPSTREAM_WORKERS)
    use_remove_padding: bool = opt(False, "Packed sequences.", inert=_PERF_ONLY)
    use_dynamic_bsz: bool = opt(False, "Token-budget micro-batches.", inert=_PERF_ONLY)
    max_packing_token_size: int | None = opt(None, "Token budget for use_dynamic_bsz.", inert=_PERF_ONLY)
    partial_rollout_max_split: int = opt(1, "Resume unfinished responses later.", inert=_NOT_IMPLEMENTED)
    async_engine: bool = opt(False, "Streaming per-request generation.", inert=_NOT_IMPLEMENTED)
    data_strategy: str | None = opt(None, "Upstream data-transfer strategy.", inert=_NOT_IMPLEMENTED)
    filter_groups_enable: bool = opt(False, "DAPO dynamic sampling.", inert=_NOT_IMPLEMENTED)
    log_max_throughput: bool = opt(False, "Upstream throughput metric variant.", inert=_NOT_IMPLEMENTED)

    def mini_batch_prompts(self, global_batch_size: int) -> int:
        """Prompts per optimizer step, resolving 0 to the whole global batch."""
        return self.mini_batch_size or global_batch_size
