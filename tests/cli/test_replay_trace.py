"""Trace replay end to end: real CLI, real Ray, HF engine, a tiny synthetic trace, two conditions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

NUM_PROMPTS, N, GLOBAL_BATCH, SCALE = 8, 2, 4, 0.5
COLUMNS = {"mean_iteration_seconds", "iteration_trend_spearman", "queue_std_samples", "queue_max_samples"}


def write_trace(path: Path) -> dict[str, list[int]]:
    rng = np.random.default_rng(3)
    lengths = {f"q{i}": [int(x) for x in rng.integers(4, 60, size=N)] for i in range(NUM_PROMPTS)}
    rows = [{"prompt_id": pid, "response_tokens": v} for pid, vs in lengths.items() for v in vs]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return lengths


def test_replay_two_conditions(tmp_path: Path) -> None:
    lengths = write_trace(tmp_path / "trace.jsonl")
    out = tmp_path / "replay.json"
    cmd = [
        sys.executable, str(ROOT / "cli" / "replay_trace.py"),
        "--trace", str(tmp_path / "trace.jsonl"), "--scale", str(SCALE), "--tau", "0.6",
        "--conditions", "C0,C4", "--iters", "2", "--global-batch", str(GLOBAL_BATCH),
        "--b", "2", "--kappa", "0", "--k", "2", "--sa-iterations", "500", "--step-seconds", "0.2",
        "--backend", "hf", "--run-dir", str(tmp_path / "runs"), "--json", str(out),
        f"megatron_training.tokenizer_name_or_path={tmp_path / 'model'}",
        "async_config.queue_max_samples=16", "async_config.queue_resume_samples=8",
        "async_config.gu_queue_low=1", "async_config.gu_queue_high=2",
        "async_config.num_generation_units=1", "async_config.actors_per_unit=1",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report = json.loads(out.read_text())
    assert [row["condition"] for row in report["table4b"]] == ["C0", "C4"]
    expected_total = sum(max(1, round(v * SCALE)) for vs in lengths.values() for v in vs)
    for name, run in report["runs"].items():
        assert set(run["row"]) >= COLUMNS, name
        assert run["row"]["num_iterations"] == 2
        assert run["prompts_scheduled"] == run["prompts_consumed"] == 2 * GLOBAL_BATCH
        # Every sample is generated at its forced length, so the run's token count is the trace's.
        assert run["response_tokens_generated"] == run["response_tokens_expected"] == expected_total
    assert "| C4 |" in proc.stdout

    # Its simulated twin: a profile calibrated from both runs, the same settings, both conditions.
    comparison = tmp_path / "sim.json"
    cmd = [sys.executable, str(ROOT / "cli" / "sim_vs_replay.py"), "--report", str(out), "--fit-from", "all",
           "--json", str(comparison)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    sim = json.loads(comparison.read_text())
    assert sim["fit_from"] == ["C0", "C4"] and sim["calibration"]["decode_fit"]["num_runs"] == 2 * 2 * 2
    for row in sim["comparison"]:
        assert row["sim"]["num_iterations"] == 2 and np.isfinite(row["mean_iteration_rel_error"]), row
    assert "| C4 (fit) |" in proc.stdout


def test_an_existing_run_directory_is_refused_before_anything_runs(tmp_path: Path) -> None:
    from cli import replay_trace

    write_trace(tmp_path / "trace.jsonl")
    (tmp_path / "runs" / "C4").mkdir(parents=True)
    args = replay_trace._parser().parse_args(
        ["--trace", str(tmp_path / "trace.jsonl"), "--scale", str(SCALE), "--conditions", "C0,C4", "--iters", "2",
         "--global-batch", str(GLOBAL_BATCH), "--b", "2", "--kappa", "0", "--sa-iterations", "100",
         "--run-dir", str(tmp_path / "runs")]
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"already holds runs of \['C4'\]"):
        replay_trace.replay(args)
    assert not (tmp_path / "runs" / "C0").exists()
