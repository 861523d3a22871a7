"""Run plans of the shipped tiny configs at test size, and synthetic prompt records."""

from __future__ import annotations

from pathlib import Path

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.contracts import RolloutSpec
from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.plan.build import RunPlan, build_run_plan

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# 4 prompts x 8 samples per global batch, with queue bounds that hold it.
SMALL_ASYNC = (
    "megatron_training.global_batch_size=4",
    "rl_config.mini_batch_size=4",
    "rl_config.actor_forward_micro_batch_size=8",
    "rl_config.ref_forward_micro_batch_size=8",
    "actor_config.micro_batch_size=8",
    "async_config.queue_max_samples=64",
    "async_config.queue_resume_samples=32",
)


def small_async_plan(*overrides: str) -> RunPlan:
    return build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_asp", (*SMALL_ASYNC, *overrides)))


def hf_rollout_spec(model: Path, *overrides: str, n: int = 2) -> RolloutSpec:
    """A generation actor's spec on the HF engine for ``model``, ``n`` samples per prompt, batch
    sizes that hold them; ``overrides`` come last."""
    config = load_config_from_files(
        CONFIGS,
        "grpo_tiny_asp",
        (
            f"megatron_training.tokenizer_name_or_path={model}",
            "rl_config.rollout_backend=hf",
            f"rl_config.n_samples_per_prompt={n}",
            "actor_config.micro_batch_size=16",
            "rl_config.actor_forward_micro_batch_size=32",
            "rl_config.ref_forward_micro_batch_size=32",
            *overrides,
        ),
    )
    return build_run_plan(config).rollout


def prompt_records(n: int) -> list[PromptRecord]:
    """``p0..p{n-1}``; prompt i's label has i characters (the demo's true length is label + eos)."""
    return [
        PromptRecord(prompt_id=f"p{i}", text=f"cp:{i}=", token_ids=(1, i), label="x" * i) for i in range(n)
    ]
