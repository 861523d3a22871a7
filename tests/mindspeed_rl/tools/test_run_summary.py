"""summary.json's ``tools`` block from the per-iteration tools/* metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mindspeed_rl.tools.run_summary import add_tool_summary, tool_summary


def _row(i: int, calling: float, ok: float) -> dict[str, float]:
    return {
        "iteration": i, "reward_mean": 0.0, "tools/calls": 10.0, "tools/errors": 10.0 * (1 - ok),
        "tools/calling_fraction": calling, "tools/ok_call_fraction": ok, "tools/calls_per_sample": 0.5,
        "tools/truncated_responses": 1.0, "tools/seconds": 0.25,
    }  # fmt: skip


def test_totals_and_first_and_last_iterations() -> None:
    rows = [_row(i, calling=0.1 * i, ok=0.5 if i < 5 else 1.0) for i in range(10)]
    block = tool_summary(rows)
    assert block is not None
    assert block["calls_total"] == 100 and block["errors_total"] == 25
    assert block["error_fraction"] == pytest.approx(0.25)
    assert block["truncated_responses_total"] == 10 and block["seconds_total"] == pytest.approx(2.5)
    assert block["calling_fraction_first"] == pytest.approx(0.2)
    assert block["calling_fraction_last"] == pytest.approx(0.7)
    assert (block["ok_call_fraction_first"], block["ok_call_fraction_last"]) == (0.5, 1.0)
    assert tool_summary([{"iteration": 0, "reward_mean": 1.0}]) is None


def test_written_into_summary_json_only_for_tool_runs(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"pipeline": "hybrid"}))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(_row(i, 0.5, 1.0)) + "\n" for i in range(3)))
    add_tool_summary(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["pipeline"] == "hybrid" and summary["tools"]["calls_total"] == 30
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "summary.json").write_text(json.dumps({"pipeline": "hybrid"}))
    (plain / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "reward_mean": 1.0}) + "\n")
    add_tool_summary(plain)
    assert "tools" not in json.loads((plain / "summary.json").read_text())
