"""End-to-end runs several test files read (one CLI run each per session; fixtures in conftest.py).

Each shared run is configured so that every test reading it finds what it checks: the tests that
once started a run apiece now assert, each in its own test function, on the one run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.cli_runs import CliRun, run_cli
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
