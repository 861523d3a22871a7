"""MetricsWriter: every iteration to metrics.jsonl, console lines every log_interval, W&B offline."""

from __future__ import annotations

import builtins
import math
from pathlib import Path

import pytest

from mindspeed_rl.utils.logging_config import LoggingConfig
from mindspeed_rl.utils.metrics import MetricsWriter, read_metrics


def _quiet(**kwargs) -> LoggingConfig:
    return LoggingConfig(use_tensorboard=False, **kwargs)


def test_every_iteration_reaches_the_file_but_only_every_log_interval_th_is_logged(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path, _quiet(log_interval=3)) as sink:
        logged = []
        for it in range(8):
            sink.write(it, {"reward_mean": it / 10, "nested": {"a": 1}, "nan": math.nan})
            if sink.should_log(it):
                logged.append(it)
    # Megatron counts from 1: interval 3 logs the 3rd, 6th, ... iteration.
    assert logged == [2, 5]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == list(range(8))
    assert rows[1] == {"iteration": 1, "reward_mean": 0.1, "nested/a": 1, "nan": None}


def test_log_interval_one_logs_every_iteration(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path, _quiet()) as sink:
        assert all(sink.should_log(it) for it in range(5))


def test_bad_log_interval_and_mixed_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="log_interval=0"):
        MetricsWriter(tmp_path, _quiet(log_interval=0))
    with pytest.raises(ValueError, match="not both"):
        MetricsWriter(tmp_path, _quiet(), use_tensorboard=False)


def test_missing_wandb_is_an_error_naming_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ValueError, match="pip install wandb"):
        MetricsWriter(tmp_path, _quiet(use_wandb=True))


@pytest.mark.integration  # starts W&B's own service process (seconds, slower on a loaded host)
def test_wandb_offline_writes_a_run_folder_with_the_logged_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    save_dir = tmp_path / "wb"
    config = _quiet(use_wandb=True, wandb_project="asp", wandb_exp_name="unit", wandb_save_dir=str(save_dir))
    with MetricsWriter(tmp_path / "run", config) as sink:
        sink.write(0, {"reward_mean": 0.25, "eval": {"accuracy": 0.5}})
        sink.write(1, {"reward_mean": 0.75})
    # finish() hands the records to W&B's service process, which writes the file on its own
    # schedule (CI once read only the 7-byte header right after finish on a loaded host);
    # teardown waits for that service to flush and exit, as the end of a training process does.
    wandb.teardown()
    (run_folder,) = (save_dir / "wandb").glob("offline-run-*")
    (records,) = run_folder.glob("run-*.wandb")
    # The offline log is W&B's binary record stream; the metric names travel in it verbatim.
    data = records.read_bytes()
    assert b"reward_mean" in data and b"eval/accuracy" in data
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
