"""DAPO end to end through ``cli/train_dapo.py``: the async pipeline (dynamic sampling in the
Control Unit, the ASP reserve released as groups are filtered) and the hybrid loop, on the light
HF engine. The model is warmed up (the default SFT stage) so the filter metric has both uniform
groups (short answers every sample gets right) and mixed ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mindspeed_rl.utils.metrics import read_metrics
from tests.support.models import PolicyModels
from tests.support.ray_cluster import shared_cluster_env

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.integration, pytest.mark.slow]
ITERS, GBS = 3, 8
TINY = (
    f"megatron_training.train_iters={ITERS}",
    f"megatron_training.global_batch_size={GBS}",
    f"rl_config.filter_groups_train_batch_size={GBS}",
    f"rl_config.mini_batch_size={GBS}",
    "rl_config.n_samples_per_prompt=2",
    "actor_config.micro_batch_size=16",
    "rl_config.actor_forward_micro_batch_size=16",
    "rl_config.ref_forward_micro_batch_size=16",
    "asp_config.b=4",
    "asp_config.kappa=0",
    "asp_config.k=2",
    "asp_config.sa_iterations=1000",
    "async_config.num_generation_units=1",
    "async_config.actors_per_unit=1",
    "async_config.queue_max_samples=64",
    "async_config.queue_resume_samples=32",
    "async_config.gu_queue_low=1",
    "async_config.gu_queue_high=2",
    "generate_config.sampling_config.max_tokens=24",
    "rl_config.rollout_max_tokens=24",
    "rl_config.overlong_buffer=8",
    "rl_config.use_tensorboard=false",
    "rl_config.rollout_backend=hf",
    # With 24 distinct prompts the pass/fail metric filters most groups of a barely trained model;
    # the partial-credit reward drops only the groups whose samples score equally (both right, or
    # wrong alike), which with two samples per prompt happens to a share of the groups every run.
    "rl_config.filter_groups_metric=demo",
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, policy_models: PolicyModels) -> Path:
    workdir = tmp_path_factory.mktemp("dapo")
    policy_models.provide(workdir / "model", "dapo_tiny_asp", TINY)
    return workdir


def _run(workdir: Path, name: str, *overrides: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    runs = workdir / name
    cmd = [
        sys.executable, str(ROOT / "cli" / "train_dapo.py"), "--config-name", "dapo_tiny_asp",
        f"run_dir={runs}", f"megatron_training.tokenizer_name_or_path={workdir / 'model'}", *TINY, *overrides,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=workdir, capture_output=True, text=True, timeout=900, env=shared_cluster_env()
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert (
        "DAPO: clip_higher=on, token_level_loss=on, overlong_penalty=on, dynamic_sampling=on" in proc.stderr
    )
    (run_dir,) = list(runs.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary, read_metrics(run_dir / "metrics.jsonl")


def _check_trained_groups(metrics: list[dict[str, Any]]) -> None:
    assert [m["iteration"] for m in metrics] == list(range(ITERS))
    for m in metrics:
        assert m["dapo/groups_kept"] == GBS and m["num_samples"] == GBS * 2
        assert m["reward/groups_without_spread"] == 0  # every trained group carries a signal
        assert m["dapo/gen_batches"] >= 1
        assert "reward/overlong_penalty_mean" in m


def test_dapo_async_filters_oversamples_and_consumes_once(workdir: Path) -> None:
    summary, metrics = _run(workdir, "async")
    _check_trained_groups(metrics)
    assert summary["groups_filtered_total"] > 0
    assert summary["prompts_consumed_unique_total"] == summary["prompts_consumed_total"]
    filtered = sum(m["dapo/groups_filtered"] for m in metrics)
    # Trained + charged-filtered prompts are what the lineage consumed.
    assert summary["prompts_consumed_total"] == ITERS * GBS + filtered
    assert filtered <= summary["groups_filtered_total"]


def test_dapo_hybrid_runs_the_same_recipe(workdir: Path) -> None:
    summary, metrics = _run(workdir, "hybrid", "rl_config.pipeline=hybrid")
    _check_trained_groups(metrics)
    assert summary["groups_filtered_total"] == sum(m["dapo/groups_filtered"] for m in metrics)
    gen = sum(m["dapo/gen_batches"] for m in metrics)
    assert summary["prompts_oversampled_total"] == (gen - ITERS) * GBS


def test_dapo_async_killed_mid_run_then_resumed_consumes_every_prompt_once(workdir: Path) -> None:
    """SIGKILL after the first checkpoint, resume with ``actor_config.load``: across the lineage
    every prompt is consumed once, the filtered ones and the released reserve included. The
    checkpoint after iteration 4 is held before its commit (``HOLD``), so the one after iteration 2
    is the newest complete one whenever the kill lands."""
    import os
    import signal
    import tempfile
    import time
    from collections import Counter

    from test_resume_e2e import HOLD, _env, _joined_env, _kill_leftover_ray

    from mindspeed_rl.trainer import checkpointing as ckpt

    runs, save = workdir / "resume_runs", workdir / "resume_save"
    iters = 4
    cmd = [
        sys.executable, str(ROOT / "cli" / "train_dapo.py"), "--config-name", "dapo_tiny_asp",
        f"run_dir={runs}", f"megatron_training.tokenizer_name_or_path={workdir / 'model'}", *TINY,
        f"megatron_training.train_iters={iters}", "megatron_training.save_interval=2",
        f"++actor_config.save={save}",
    ]  # fmt: skip
    ray_dir = tempfile.mkdtemp(prefix="rk", dir="/tmp")
    log = (workdir / "killed.log").open("w")
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        env=_env(ray_dir, **HOLD),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    try:
        while ckpt.find_latest(save) is None:
            assert proc.poll() is None, (workdir / "killed.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "no checkpoint within 600 s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        _kill_leftover_ray(ray_dir)
        log.close()
    latest = ckpt.find_latest(save)
    assert latest is not None
    fingerprint = json.loads((latest / ckpt.MANIFEST).read_text())["fingerprint"]
    resumed = ckpt.load_resume_point(save, fingerprint)
    assert resumed.iteration == 2 and any(mb.reserve for mb in resumed.schedule)
    rerun = subprocess.run(
        [*cmd, f"++actor_config.load={save}"], cwd=workdir, env=_joined_env(),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-6000:]
    (run_dir,) = [d for d in runs.iterdir() if (d / "summary.json").is_file()]
    steps = [json.loads(line) for line in (run_dir / ckpt.CONSUMED_LOG).read_text().splitlines()]
    assert [s["iteration"] for s in steps] == [2, 3]
    lineage = Counter([*resumed.prompts_consumed, *(p for s in steps for p in s["prompt_ids"])])
    assert max(lineage.values()) == 1
    metrics = read_metrics(run_dir / "metrics.jsonl")
    trained = sum(m["dapo/groups_kept"] for m in metrics) + 2 * GBS
    assert sum(lineage.values()) == trained + sum(m["dapo/groups_filtered"] for m in metrics) + (
        len(resumed.prompts_consumed) - 2 * GBS
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from_iteration"] == 2
    assert (
        summary["prompts_consumed_unique_total"] == summary["prompts_consumed_total"] == sum(lineage.values())
    )
