"""cli/simulate.py end to end on a small synthetic preset and on a small trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli import simulate

SMALL_PRESET = """
name: small
profile:
  decode: {per_step_seconds: 0.1, per_token_seconds: 0.001}
  train: {per_step_seconds: 30.0}
  weight_flow: {save_seconds: 1.0, convert_seconds: 2.0, load_seconds: 3.0}
reference: {t_gen_seconds: 40.0}
cluster: {num_generation_units: 2, actors_per_gu: 2}
workload:
  synthetic: {num_prompts: 96, num_samples_per_prompt: 2, median_tokens: 300, max_tokens: 1000}
schedule: {b: 4, kappa: 1, k: 3, tau: 0.7, sa_iterations: 5000}
runtime: {num_prompts_per_global_batch: 8, queue_max_samples: 64, queue_resume_samples: 32,
          gu_queue_low: 1, gu_queue_high: 3, max_policy_lag: null}
"""


def test_prints_and_writes_table4b_for_every_condition(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    preset = tmp_path / "small.yaml"
    preset.write_text(SMALL_PRESET)
    out = tmp_path / "report.json"
    assert simulate.main(["--preset", str(preset), "--json", str(out), "--series", "--check-invariants"]) == 0
    text = capsys.readouterr().out
    assert "Eq. 4 from the reference timings: d_off ~ Q_arrival + 1.53" in text  # (1 + 2 + 3 + 40) / 30
    report = json.loads(out.read_text())
    assert [r["condition"] for r in report["table4b"]] == ["C0", "C1", "C2", "C3", "C4"]
    for row in report["table4b"]:
        assert row["num_iterations"] == 12 and row["mean_iteration_seconds"] > 0
    assert len(report["runs"]["C4"]["iteration_seconds"]) == 12


def test_trace_override_with_rows_as_prompts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    preset = tmp_path / "small.yaml"
    preset.write_text(SMALL_PRESET)
    trace = tmp_path / "trace.jsonl"
    rows = [{"prompt_id": f"p{i // 2}", "response_tokens": 50 + (i * 37) % 400} for i in range(64)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--preset", str(preset), "--trace", str(trace), "--rows-as-prompts", "--scale", "0.5"]
    argv += ["--conditions", "C0", "C4", "--global-batch", "16", "--train-seconds", "5", "--skip-first", "1"]
    assert simulate.main(argv) == 0
    text = capsys.readouterr().out
    assert "| C0 | 3 |" in text and "| C4 | 3 |" in text and "scale 0.5" in text
