"""cli/plan_allocation.py: explicit measurements, preset defaults, simulated verification."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli import plan_allocation

PRESET = Path(__file__).resolve().parents[2] / "configs" / "sim" / "qwen3_30b_a3b.yaml"


def test_explicit_measurements_with_verification(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    argv = ["--total-devices", "8", "--tu", "2:10", "--actor-devices", "1", "--gen-seconds", "30"]
    argv += ["--prompts-per-minibatch", "2", "--global-batch", "4", "--load-seconds", "2", "--verify", "16"]
    assert plan_allocation.main([*argv, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "6 actors x 1 devices" in text and "predicted iteration time 10.7s" in text
    report = json.loads(out.read_text())
    assert report["plan"]["num_actors"] == 6 and report["check"]["num_iterations"] == 16


def test_preset_supplies_the_paper_breakdown(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--preset", str(PRESET), "--tu-devices", "8", "--total-devices", "32", "--actor-devices", "2"]
    assert plan_allocation.main([*argv, "--actors-per-gu", "4"]) == 0
    text = capsys.readouterr().out
    assert "11 actors x 2 devices in 3 GU(s)" in text
    assert "d_off (Eq. 4, Q_arrival=0) 3.29" in text and "duty cycle 0.912" in text


def test_missing_measurement_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--gen-seconds"):
        plan_allocation.main(["--total-devices", "8", "--tu", "2:10", "--prompts-per-minibatch", "2",
                              "--global-batch", "4"])  # fmt: skip
