"""``generate_config``: the rollout engine and its sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mindspeed_rl.config_cls.fields import opt, section

_HYBRID_OFFLOAD = (
    "acts only in the colocated hybrid (pipeline: hybrid on GPU/NPU, or on CPU with rl_config.colocate: "
    "true; workers/colocation.py); elsewhere trainer and rollout are separate processes, so there is "
    "nothing to free"
)
_ASCEND = (
    "vllm-ascend option; not passed to the rollout engine (vLLM and vllm-ascend start with their defaults)"
)
_EPLB = "vllm-ascend expert load balancing (placement only, same results); not passed to the rollout engine"
_MULTIMODAL = "multimodal models are not supported: the policy is a text-only Qwen model"


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingConfig:
    """Per-request sampling, as in vLLM's ``SamplingParams``."""

    logprobs: int = opt(1, "Log-probs returned per token (we need the sampled token's: >= 0).")
    max_tokens: int = opt(2048, "Response cap in tokens.")
    min_tokens: int = opt(0, "Minimum response tokens.")
    top_p: float = opt(1.0, "Nucleus sampling mass.")
    top_k: int = opt(-1, "Top-k; -1 = off.")
    min_p: float = opt(0.0, "Min-p; 0 = off.")
    temperature: float = opt(1.0, "Sampling temperature (GRPO: 1.0 keeps log-probs on-policy).")
    repetition_penalty: float = opt(1.0, "1.0 = off.")
    detokenize: bool = opt(False, "Return text too (rewards detokenize themselves).")
    seed: int | None = opt(None, "Sampling seed; null = engine default.")


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateConfig:
    """Rollout engine layout and limits. In the async pipeline each generation actor's layout is
    async_config.actor_tensor_parallel_size / actor_expert_parallel_size."""

    trust_remote_code: bool = opt(False, "Allow custom model code in the HF folder.")
    infer_tensor_parallel_size: int = opt(1, "Rollout TP (hybrid pipeline).")
    infer_pipeline_parallel_size: int = opt(1, "Rollout PP; must be 1 (as upstream).")
    infer_expert_parallel_size: int = opt(
        1,
        "Rollout EP (hybrid pipeline, MoE).",
        inert="vLLM derives expert parallelism from TP x DP (enable_expert_parallel); no EP size setting",
    )
    enable_expert_parallel: bool = opt(False, "vLLM expert parallelism for MoE.")
    max_num_seqs: int = opt(256, "vLLM: sequences decoded together.")
    max_model_len: int = opt(4096, "vLLM: prompt + response tokens per sequence.")
    max_num_batched_tokens: int = opt(8192, "vLLM: tokens per scheduler step.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = opt(
        "bfloat16", "Rollout dtype; float32 on CPU for exact log-prob agreement with the trainer."
    )
    gpu_memory_utilization: float = opt(0.5, "vLLM accelerator memory fraction (GPU/NPU).")
    enforce_eager: bool = opt(True, "Disable graph capture (required on CPU).")
    enable_prefix_caching: bool = opt(False, "vLLM prefix cache (reset after each weight reload).")
    enable_chunked_prefill: bool = opt(False, "vLLM chunked prefill.")
    offload_train_optimizer: bool = opt(False, "Offload optimizer during rollout.", inert=_HYBRID_OFFLOAD)
    offload_train_grad: bool = opt(False, "Offload grads during rollout.", inert=_HYBRID_OFFLOAD)
    offload_train_param: bool = opt(False, "Offload params during rollout.", inert=_HYBRID_OFFLOAD)
    torchair_graph: bool = opt(False, "Ascend graph mode.", inert=_ASCEND)
    ascend_scheduler_config_enabled: bool = opt(False, "Ascend scheduler.", inert=_ASCEND)
    num_scheduler_steps: int = opt(
        1,
        "vLLM multi-step scheduling.",
        inert="vLLM V1 (the engine here) schedules one step at a time; multi-step was a V0 performance knob",
    )
    data_parallel_size: int | None = opt(
        None,
        "Rollout data-parallel size.",
        inert=(
            "follows from the devices: hybrid = the trainer's devices / (infer TP x PP) engines, async = "
            "async_config.num_generation_units x actors_per_unit"
        ),
    )
    tokenizer_name_or_path: str | None = opt(
        None,
        "Tokenizer of the rollout engine (upstream's default is a placeholder path).",
        inert="the rollout engine loads the policy folder's tokenizer (megatron_training.tokenizer_name_or_path)",
    )
    eplb_token_collects: bool = opt(False, "Collect expert-load statistics.", inert=_EPLB)
    eplb_token_save_path: str = opt("./", "Where expert-load statistics go.", inert=_EPLB)
    expert_map_path: str | None = opt(None, "Expert placement map.", inert=_EPLB)
    limit_mm_image_per_prompt: int = opt(1, "Images per prompt.", refused=_MULTIMODAL)
    limit_mm_video_per_prompt: int = opt(0, "Videos per prompt.", refused=_MULTIMODAL)
    sampling_config: SamplingConfig = section(SamplingConfig, "Sampling parameters.")
