"""The end-of-run block, built from the files a run leaves (hybrid, async, resumed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mindspeed_rl.trainer.run_end import end_block, plots_at_checkpoint, read_run_end, report_run_end


def write_run(
    run_dir: Path, *, pipeline: str, first: int = 0, iterations: int = 10, **summary: object
) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config_resolved.json").write_text("{}")
    with (run_dir / "metrics.jsonl").open("w") as handle:
        for i in range(first, first + iterations):
            record = {
                "iteration": i,
                "reward_mean": 0.40 + 0.02 * (i - first),
                "num_response_tokens": 1000,
                "iteration_time_s": 0.5,
                "tokens_per_s": 2000.0,
            }
            if i % 5 == 4:
                record["eval/accuracy"] = 0.05 * (i - first)
            handle.write(json.dumps(record) + "\n")
    base = {"pipeline": pipeline, "prompts_scheduled": 320, "prompts_consumed_total": 320}
    (run_dir / "summary.json").write_text(json.dumps({**base, **summary}))
    (run_dir / "final_model").mkdir()
    return run_dir


def test_async_block_names_every_figure_and_path(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "run",
        pipeline="async",
        max_queue_depth_samples=704,
        queue_bound_samples=768,
        queue_limit_samples=512,
        max_policy_lag_measured=4,
        mean_policy_lag_measured=2.5,
        max_policy_lag_limit=4,
        actor_restarts=0,
        minibatches_reissued=2,
    )
    stamp = (run / "config_resolved.json").stat().st_mtime
    block = end_block(read_run_end(run, plots=[run / "plots" / "reward.png"], now=stamp + 125))
    lines = block.splitlines()
    assert lines[0] == f"== run finished: {run}"
    assert "async pipeline, 10 iterations (0-9) in 2 min 05 s" in lines[1]
    # first 5 rewards: 0.40..0.48 (mean 0.44); last 5: 0.50..0.58 (mean 0.54)
    assert "reward         0.440 -> 0.540 (+0.100)" in block
    assert "eval accuracy  0.200 -> 0.450 (+0.250)   held-out, after iteration 4 -> 9" in block
    assert "tokens/s       2,000" in block
    assert "prompts        320 consumed of 320 scheduled" in block
    assert "queue max      704 samples (bound 768)" in block
    assert "policy lag     max 4, mean 2.50 (limit 4)" in block
    assert "restarts/faults minibatches_reissued=2" in block
    assert f"summary        {run / 'summary.json'}" in block
    assert f"plots          {run / 'plots'}/  reward.png" in block
    assert f"final model    {run / 'final_model'}" in block


def test_hybrid_block_has_no_queue_and_says_no_faults(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", pipeline="hybrid", max_queue_depth_samples=0, max_policy_lag_measured=0)
    block = end_block(read_run_end(run))
    assert "hybrid pipeline" in block and "queue max" not in block
    assert "policy lag     max 0" in block and "restarts/faults none" in block


def test_resumed_run_says_where_it_resumed(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", pipeline="async", first=10, resumed_from_iteration=10)
    block = end_block(read_run_end(run))
    assert "10 iterations (10-19)" in block and "resumed from iteration 10" in block


def test_a_run_without_evaluation_says_how_to_get_one(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", pipeline="hybrid", iterations=3)
    lines = [line for line in (run / "metrics.jsonl").read_text().splitlines() if "eval" not in line]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    block = end_block(read_run_end(run))
    assert "eval accuracy  none (set megatron_training.eval_interval" in block
    assert "mean of the first 3 -> last 3 iterations" in block


def test_report_writes_plots_and_prints_the_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", pipeline="hybrid")
    os.utime(run / "config_resolved.json", None)
    block = report_run_end(run)
    assert capsys.readouterr().out.strip() == block
    assert sorted(p.name for p in (run / "plots").iterdir()) == [
        "eval_accuracy.png",
        "reward.png",
        "tokens_per_s.png",
    ]
    assert "reward.png eval_accuracy.png tokens_per_s.png" in block


def test_checkpoint_plots_never_stop_the_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = write_run(tmp_path / "run", pipeline="async")
    plots_at_checkpoint(run)
    assert (run / "plots" / "reward.png").is_file()
    (run / "metrics.jsonl").write_text("{not json\n")
    plots_at_checkpoint(run)  # logged, not raised: the checkpoint itself is already written
    assert "could not be written at this checkpoint" in caplog.text
