"""Periodic evaluation end to end: real CLI, Ray and HF rollout; held-out prompts only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.trainer.prompts import global_batches
from mindspeed_rl.utils.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.integration]

QUICK = (
    "megatron_training.train_iters=6",
    "megatron_training.global_batch_size=8",
    "rl_config.mini_batch_size=8",
    "rl_config.n_samples_per_prompt=4",
    "actor_config.micro_batch_size=16",
    "rl_config.actor_forward_micro_batch_size=16",
    "rl_config.ref_forward_micro_batch_size=16",
    "rl_config.rollout_backend=hf",
    "generate_config.sampling_config.max_tokens=24",
    "warmup_config.steps=5",
)


def test_eval_every_interval_scores_only_held_out_prompts(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    cmd = [
        sys.executable,
        str(ROOT / "cli" / "train_grpo.py"),
        "--config-name",
        "grpo_tiny_cpu",
        f"run_dir={runs}",
        f"megatron_training.tokenizer_name_or_path={tmp_path / 'model'}",
        *QUICK,
        "megatron_training.split='90,10,0'",
        "+megatron_training.eval_interval=3",
        "+megatron_training.eval_iters=1",
        "+megatron_training.log_interval=2",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (run_dir,) = list(runs.iterdir())

    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in records] == list(range(6))
    splits = json.loads((run_dir / "split_ids.json").read_text())
    # 6 iterations x 8 prompts need 48 train prompts: 54 are generated, 5 of them held out, fewer
    # than eval_iters x global_batch_size = 8, so every evaluation scores all of them.
    num_eval = min(8, len(splits["valid"]))
    assert num_eval >= 4
    evaluated = [r for r in records if "eval/accuracy" in r]
    assert [r["iteration"] for r in evaluated] == [2, 5]
    # Decoded by the rollout engine right after each push: the weights of that iteration.
    assert [r["eval/weights_version"] for r in evaluated] == [3, 6]
    for r in evaluated:
        assert 0.0 <= r["eval/accuracy"] <= 1.0
        assert r["eval/num_prompts"] == num_eval
        assert r["eval/num_samples"] == num_eval * 4 and r["eval/response_length"] >= 1
    assert all("reward/num_timed_out" in r for r in records)
    # Console: every log_interval-th iteration (1, 3, 5), plus the evaluations (2, 5).
    console = proc.stdout + proc.stderr
    assert [it for it in range(6) if f"[it {it}/6]" in console] == [1, 2, 3, 5]

    evals = [json.loads(line) for line in (run_dir / "eval_prompts.jsonl").read_text().splitlines()]
    assert [e["iteration"] for e in evals] == [2, 5]
    eval_ids = {pid for e in evals for pid in e["prompt_ids"]}
    # What was trained: the trainer's own batch draw over the train part of the split.
    config = load_config(json.loads((run_dir / "config_resolved.json").read_text()))
    trained = {pid for batch in global_batches(build_run_plan(config).data, splits["train"]) for pid in batch}
    assert len(eval_ids) == num_eval and eval_ids <= set(splits["valid"])
    assert not eval_ids & trained and not eval_ids & set(splits["train"])
