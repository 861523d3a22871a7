"""Plots written for a run: one PNG per question, skipped when the run did not record it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.plot_metrics import main as plot_main
from mindspeed_rl.utils.plots import gu_duty_cycles, rolling_mean, write_run_plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir: Path, *, async_run: bool, iterations: int = 8) -> Path:
    run_dir.mkdir(parents=True)
    with (run_dir / "metrics.jsonl").open("w") as handle:
        for i in range(iterations):
            record: dict[str, float] = {
                "iteration": i,
                "reward_mean": 0.4 + 0.02 * i,
                "tokens_per_s": 900.0 + i,
            }
            if i % 4 == 3:
                record["eval/accuracy"] = 0.1 * i
            if async_run:
                record.update(
                    {
                        "queue/depth_samples_max": 512.0,
                        "queue/depth_samples_mean": 300.0,
                        "lag/d_off_mean": 1.5,
                        "lag/d_off_max": 3,
                        "duty_cycle/actor0_0": 0.9,
                        "duty_cycle/actor0_1": 0.7,
                        "duty_cycle/actor1_0": 0.5,
                    }
                )
            handle.write(json.dumps(record) + "\n")
    return run_dir


def test_async_run_gets_every_plot(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", async_run=True)
    (run / "summary.json").write_text(json.dumps({"queue_limit_samples": 512}))
    written = write_run_plots(run)
    names = [p.name for p in written]
    assert names == [
        "reward.png",
        "eval_accuracy.png",
        "tokens_per_s.png",
        "queue_depth.png",
        "lag.png",
        "duty_cycle.png",
    ]
    for path in written:
        assert path.parent == run / "plots" and path.read_bytes()[:8] == PNG_MAGIC
    assert not list((run / "plots").glob(".*"))  # no temporary files left behind


def test_hybrid_run_skips_what_it_does_not_record(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", async_run=False)
    assert [p.stem for p in write_run_plots(run)] == ["reward", "eval_accuracy", "tokens_per_s"]


def test_no_metrics_yet_writes_nothing(tmp_path: Path) -> None:
    assert write_run_plots(tmp_path) == []
    assert not (tmp_path / "plots").exists()


def test_duty_cycle_is_averaged_per_generation_unit() -> None:
    records = [
        {"iteration": 0, "duty_cycle/actor0_0": 0.9, "duty_cycle/actor0_1": 0.7, "duty_cycle/actor1_0": 0.5}
    ]
    lines = gu_duty_cycles(records)
    assert list(lines) == ["GU 0", "GU 1"]
    assert lines["GU 0"][1] == [pytest.approx(0.8)] and lines["GU 1"][1] == [0.5]


def test_rolling_mean_is_trailing() -> None:
    assert rolling_mean([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]


def test_plot_metrics_cli_writes_the_plots_for_any_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(tmp_path / "run", async_run=True)
    assert plot_main([str(run)]) == 0
    out = capsys.readouterr().out.split()
    assert str(run / "metrics.png") in out and str(run / "plots" / "reward.png") in out
    assert plot_main([str(tmp_path / "missing")]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err
