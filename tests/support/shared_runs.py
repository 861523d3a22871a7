"""End-to-end runs several test files read (one CLI run each per session; fixtures in conftest.py).

Each shared run is configured so that every test reading it finds what it checks: the tests that
once started a run apiece now assert, each in its own test function, on the one run."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.cli_runs import ROOT, CliRun, WatchedRun, run_cli, run_watching_descendants
from tests.support.models import PolicyModels

# The hybrid loop on vLLM at test size: 6 iterations x 8 prompts x 4 samples, an evaluation of the
# held-out split every 3 iterations, a console line every 2, a checkpoint every 2.
HYBRID_ITERS, HYBRID_PROMPTS, HYBRID_SAMPLES = 6, 8, 4
HYBRID = (
    f"megatron_training.train_iters={HYBRID_ITERS}",
    f"megatron_training.global_batch_size={HYBRID_PROMPTS}",
    f"rl_config.mini_batch_size={HYBRID_PROMPTS}",
    f"rl_config.n_samples_per_prompt={HYBRID_SAMPLES}",
    "actor_config.micro_batch_size=16",
    "rl_config.actor_forward_micro_batch_size=16",
    "rl_config.ref_forward_micro_batch_size=16",
    "generate_config.sampling_config.max_tokens=24",
    "warmup_config.steps=5",
    "megatron_training.split='90,10,0'",
    "megatron_training.eval_interval=3",
    "megatron_training.eval_iters=1",
    "megatron_training.log_interval=2",
    "megatron_training.save_interval=2",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HybridRun:
    run: CliRun
    workdir: Path
    save: Path
    """Its checkpoints (after iterations 2, 4 and 6)."""


def hybrid_run(workdir: Path, policy_models: PolicyModels) -> HybridRun:
    """``grpo_tiny_cpu`` (the hybrid loop, vLLM) with ``HYBRID``: read by test_hybrid_e2e (metrics,
    summary, model), test_periodic_eval (held-out evaluations, console lines) and test_resume_e2e
    (resuming the hybrid loop from its checkpoint)."""
    policy_models.provide(workdir / "model", "grpo_tiny_cpu", HYBRID)
    save = workdir / "save"
    run = run_cli(workdir, "grpo_tiny_cpu", (*HYBRID, f"actor_config.save={save}"), timeout=600)
    return HybridRun(run=run, workdir=workdir, save=save)


# One GU with one TP2 vLLM actor (``grpo_tiny_tp2``) on the tied-embedding Qwen3 layout: 6
# iterations x 4 prompts x 4 samples; max_policy_lag 1 forces two or more reloads whatever the
# timing (step 3 needs samples of v2 or later, step 5 of v4 or later).
TP2_TIED_MODEL = "tiny_qwen3_tied"
TP2_TIED_ITERS, TP2_TIED_PROMPTS = 6, 4
TP2_TIED = (
    f"model={TP2_TIED_MODEL}", f"megatron_training.model={TP2_TIED_MODEL}",
    f"megatron_training.train_iters={TP2_TIED_ITERS}", f"megatron_training.global_batch_size={TP2_TIED_PROMPTS}",
    "rl_config.mini_batch_size=4", "rl_config.n_samples_per_prompt=4", "actor_config.micro_batch_size=16",
    "rl_config.actor_forward_micro_batch_size=16", "rl_config.ref_forward_micro_batch_size=16",
    "warmup_config.steps=5", "asp_config.b=2", "asp_config.kappa=0", "asp_config.k=2",
    "asp_config.sa_iterations=1000", "async_config.queue_max_samples=24", "async_config.queue_resume_samples=12",
    "async_config.gu_queue_low=1", "async_config.gu_queue_high=2", "async_config.max_policy_lag=1",
    "generate_config.sampling_config.max_tokens=24", "rl_config.use_tensorboard=false",
)  # fmt: skip


def tp2_child_env() -> dict[str, str]:
    """This process's environment minus what an in-process (TP1) vLLM engine of an earlier test set
    here: VLLM_ENABLE_V1_MULTIPROCESSING=0 would (rightly) refuse a TP2 engine in the child."""
    return {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}


def tp2_tied_run(workdir: Path, policy_models: PolicyModels) -> WatchedRun:
    """``grpo_tiny_tp2`` with ``TP2_TIED``, its processes watched: read by test_tp2_actor_e2e (a TP2
    actor in the async pipeline, reloading, leaving no process behind) and by
    test_real_checkpoints_e2e (the tied layout refreshed in a CLI run)."""
    policy_models.provide(workdir / "model", "grpo_tiny_tp2", TP2_TIED)
    cmd = [
        sys.executable, str(ROOT / "cli" / "train_grpo.py"), "--config-name", "grpo_tiny_tp2",
        f"run_dir={workdir / 'runs'}", f"megatron_training.tokenizer_name_or_path={workdir / 'model'}", *TP2_TIED,
    ]  # fmt: skip
    return run_watching_descendants(cmd, workdir, timeout_s=800, env=tp2_child_env())


# One GU with one vLLM actor (``grpo_tiny_asp``) on the Qwen2.5 layout, with partial rollouts on
# (up to 3 segments, rounds of 3 tokens): 6 iterations x 4 prompts x 4 samples. max_policy_lag 1
# forces two or more reloads whatever the timing (step 3 needs samples of v2 or later, step 5 of
# v4 or later), and so responses that cross a refresh.
PARTIAL_QWEN25_MODEL = "tiny_qwen25"
PARTIAL_QWEN25_ITERS, PARTIAL_QWEN25_PROMPTS, PARTIAL_QWEN25_SAMPLES = 6, 4, 4
PARTIAL_QWEN25_SPLIT = 3
PARTIAL_QWEN25 = (
    f"model={PARTIAL_QWEN25_MODEL}", f"megatron_training.model={PARTIAL_QWEN25_MODEL}",
    f"megatron_training.train_iters={PARTIAL_QWEN25_ITERS}",
    f"megatron_training.global_batch_size={PARTIAL_QWEN25_PROMPTS}", "rl_config.mini_batch_size=4",
    f"rl_config.n_samples_per_prompt={PARTIAL_QWEN25_SAMPLES}", "actor_config.micro_batch_size=16",
    "rl_config.actor_forward_micro_batch_size=16", "rl_config.ref_forward_micro_batch_size=16",
    "warmup_config.steps=5", "asp_config.b=2", "asp_config.kappa=0", "asp_config.k=2",
    "asp_config.sa_iterations=1000", "async_config.queue_max_samples=24", "async_config.queue_resume_samples=12",
    "async_config.gu_queue_low=1", "async_config.gu_queue_high=2", "async_config.num_generation_units=1",
    "async_config.actors_per_unit=1", "async_config.max_policy_lag=1",
    "generate_config.sampling_config.max_tokens=24", "rl_config.use_tensorboard=false",
    f"rl_config.partial_rollout_max_split={PARTIAL_QWEN25_SPLIT}", "rl_config.partial_rollout_chunk_tokens=3",
)  # fmt: skip


def partial_qwen25_run(workdir: Path, policy_models: PolicyModels) -> CliRun:
    """``grpo_tiny_asp`` with ``PARTIAL_QWEN25``: read by test_async_e2e (the pipeline's invariants
    with partial rollouts on vLLM) and by test_real_checkpoints_e2e (the Qwen2.5 layout refreshed
    in a CLI run). One run replaces two that differed only in these settings."""
    policy_models.provide(workdir / "model", "grpo_tiny_asp", PARTIAL_QWEN25)
    return run_cli(workdir, "grpo_tiny_asp", PARTIAL_QWEN25)
