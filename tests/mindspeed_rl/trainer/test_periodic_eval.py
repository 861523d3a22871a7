"""Periodic evaluation end to end: real CLI, Ray and vLLM rollout; held-out prompts only.

Reads the session's shared hybrid run (``conftest.hybrid_run``: 6 iterations of 8 prompts x 4
samples, split 90/10, ``eval_interval=3``, ``eval_iters=1``, ``log_interval=2``)."""

from __future__ import annotations

import json

import pytest

from mindspeed_rl.config_cls import load_config
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.trainer.prompts import global_batches
from mindspeed_rl.utils.metrics import read_metrics
from tests.support.shared_runs import HYBRID_ITERS, HYBRID_PROMPTS, HYBRID_SAMPLES, HybridRun

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def test_eval_every_interval_scores_only_held_out_prompts(hybrid_run: HybridRun) -> None:
    run_dir = hybrid_run.run.run_dir
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in records] == list(range(HYBRID_ITERS))
    splits = json.loads((run_dir / "split_ids.json").read_text())
    # 6 iterations x 8 prompts need 48 train prompts: 54 are generated, 5 of them held out, fewer
    # than eval_iters x global_batch_size = 8, so every evaluation scores all of them.
    num_eval = min(HYBRID_PROMPTS, len(splits["valid"]))
    assert num_eval >= 4
    evaluated = [r for r in records if "eval/accuracy" in r]
    assert [r["iteration"] for r in evaluated] == [2, 5]
    # Decoded by the rollout engine right after each push: the weights of that iteration.
    assert [r["eval/weights_version"] for r in evaluated] == [3, 6]
    for r in evaluated:
        assert 0.0 <= r["eval/accuracy"] <= 1.0
        assert r["eval/num_prompts"] == num_eval
        assert r["eval/num_samples"] == num_eval * HYBRID_SAMPLES and r["eval/response_length"] >= 1
    assert all("reward/num_timed_out" in r for r in records)
    # Console: every log_interval-th iteration (1, 3, 5), plus the evaluations (2, 5).
    console = hybrid_run.run.output
    assert [it for it in range(HYBRID_ITERS) if f"[it {it}/{HYBRID_ITERS}]" in console] == [1, 2, 3, 5]

    evals = [json.loads(line) for line in (run_dir / "eval_prompts.jsonl").read_text().splitlines()]
    assert [e["iteration"] for e in evals] == [2, 5]
    eval_ids = {pid for e in evals for pid in e["prompt_ids"]}
    # What was trained: the trainer's own batch draw over the train part of the split.
    config = load_config(json.loads((run_dir / "config_resolved.json").read_text()))
    trained = {pid for batch in global_batches(build_run_plan(config).data, splits["train"]) for pid in batch}
    assert len(eval_ids) == num_eval and eval_ids <= set(splits["valid"])
    assert not eval_ids & trained and not eval_ids & set(splits["train"])
