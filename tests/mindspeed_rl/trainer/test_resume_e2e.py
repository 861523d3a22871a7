"""Crash and resume end to end: the real CLI in its own process group, killed with SIGKILL, then
rerun with ``actor_config.load=<save dir>``; exactly-once per prompt is proven across the lineage.

Each CLI run gets its own Ray temp dir (``RAY_TMPDIR``) and a local cluster (``RAY_ADDRESS=local``),
so it never joins another test's cluster, and the killed run's Ray processes are found by that
dir and killed by pid before the rerun.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cli.checkpoint_hooks import DELAY_ENV
from mindspeed_rl.trainer import checkpointing as ckpt

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.integration, pytest.mark.slow]
TRAIN_ITERS, PROMPTS_PER_ITER = 6, 4
# 6 iterations x 4 prompts, minibatches of 2 prompts, one GU with two light HF actors.
TINY = (
    f"megatron_training.train_iters={TRAIN_ITERS}",
    f"megatron_training.global_batch_size={PROMPTS_PER_ITER}",
    "megatron_training.save_interval=2",
    "rl_config.mini_batch_size=4",
    "rl_config.n_samples_per_prompt=4",
    "actor_config.micro_batch_size=16",
    "rl_config.actor_forward_micro_batch_size=16",
    "rl_config.ref_forward_micro_batch_size=16",
    "warmup_config.steps=5",
    "asp_config.b=2",
    "asp_config.kappa=0",
    "asp_config.k=2",
    "asp_config.sa_iterations=1000",
    "async_config.num_generation_units=1",
    "async_config.actors_per_unit=2",
    "async_config.queue_max_samples=24",
    "async_config.queue_resume_samples=12",
    "async_config.gu_queue_low=1",
    "async_config.gu_queue_high=2",
    "generate_config.sampling_config.max_tokens=24",
    "rl_config.use_tensorboard=false",
    "rl_config.rollout_backend=hf",
)


def _command(tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable, str(ROOT / "cli" / "train_grpo.py"), "--config-name", "grpo_tiny_asp",
        f"run_dir={tmp_path / 'runs'}", f"megatron_training.tokenizer_name_or_path={tmp_path / 'model'}",
        f"++actor_config.save={tmp_path / 'save'}", *TINY, *extra,
    ]  # fmt: skip


def _env(ray_dir: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", DELAY_ENV)}
    return {**env, "RAY_TMPDIR": ray_dir, "RAY_ADDRESS": "local", **extra}


def _kill_leftover_ray(ray_dir: str) -> None:
    """SIGKILL every process whose command line names this run's Ray temp dir (its raylet, GCS,
    workers) in case they outlived the process group."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if ray_dir in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def _num_iterations_done(runs: Path) -> int:
    logs = list(runs.glob("*/metrics.jsonl"))
    return len(logs[0].read_text().splitlines()) if logs else 0


def _run_then_kill(tmp_path: Path, until: Any, ray_dir: str, **env: str) -> None:
    """Start the CLI in its own session, SIGKILL its whole process group once ``until()`` holds."""
    log = (tmp_path / "killed.log").open("w")
    proc = subprocess.Popen(
        _command(tmp_path), cwd=tmp_path, env=_env(ray_dir, **env),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    try:
        while not until():
            assert proc.poll() is None, (
                "the run ended before the kill:\n" + (tmp_path / "killed.log").read_text()[-4000:]
            )
            assert time.monotonic() < deadline, "timed out waiting for the kill point"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        _kill_leftover_ray(ray_dir)
        log.close()


def _resume(tmp_path: Path, ray_dir: str) -> Path:
    before = set((tmp_path / "runs").iterdir())
    proc = subprocess.run(
        _command(tmp_path, f"++actor_config.load={tmp_path / 'save'}"), cwd=tmp_path, env=_env(ray_dir),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    _kill_leftover_ray(ray_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (run_dir,) = set((tmp_path / "runs").iterdir()) - before
    return run_dir


def _check_lineage(run_dir: Path, resumed: ckpt.ResumePoint, save: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    total = TRAIN_ITERS * PROMPTS_PER_ITER
    assert summary["resumed_from_iteration"] == resumed.iteration
    assert summary["prompts_consumed_total"] == summary["prompts_scheduled"] == total
    assert (
        summary["prompts_consumed"]
        == summary["prompts_scheduled_this_run"]
        == total - len(resumed.prompts_consumed)
    )
    steps = [json.loads(line) for line in (run_dir / ckpt.CONSUMED_LOG).read_text().splitlines()]
    assert [s["iteration"] for s in steps] == list(range(resumed.iteration, TRAIN_ITERS))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == list(range(resumed.iteration, TRAIN_ITERS))
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    popped = [e for e in events if e["event"] == "GlobalBatchPopped"]
    assert [e["num_prompts"] for e in popped] == [len(s["prompt_ids"]) for s in steps]
    # Exactly once across the lineage: the checkpoint's consumed list + what the rerun trained.
    lineage = Counter([*resumed.prompts_consumed, *(p for s in steps for p in s["prompt_ids"])])
    scheduled = {p for mb in resumed.schedule for p in mb.prompt_ids}
    assert set(lineage) == scheduled and len(scheduled) == total
    assert max(lineage.values()) == 1
    final = ckpt.load_resume_point(save, _saved_fingerprint(save))
    assert final.iteration == TRAIN_ITERS and Counter(final.prompts_consumed) == lineage


def test_sigkill_after_a_checkpoint_then_resume_consumes_every_prompt_once(tmp_path: Path) -> None:
    rng = random.Random()
    # Iterations done when the group is killed: at most 4, so the run cannot have finished (a tiny
    # iteration takes about a second here; the poll looks every 50 ms).
    kill_after = rng.randint(2, TRAIN_ITERS - 2)
    print(f"killing after iteration {kill_after}")
    save = tmp_path / "save"
    ray_dir = tempfile.mkdtemp(prefix="rk", dir="/tmp")
    _run_then_kill(
        tmp_path,
        lambda: ckpt.find_latest(save) is not None and _num_iterations_done(tmp_path / "runs") >= kill_after,
        ray_dir,
    )
    resumed = ckpt.load_resume_point(save, _saved_fingerprint(save))
    assert (
        resumed.iteration in (2, 4) and len(resumed.prompts_consumed) == resumed.iteration * PROMPTS_PER_ITER
    )
    _check_lineage(_resume(tmp_path, ray_dir), resumed, save)


def test_sigkill_during_a_checkpoint_write_keeps_the_previous_one(tmp_path: Path) -> None:
    save = tmp_path / "save"
    ray_dir = tempfile.mkdtemp(prefix="rk", dir="/tmp")
    partial = save / ".iter_0000004.partial"
    # Each write waits 6 s between its files and its commit: kill 1 s into the second write's wait.
    state = {"seen": 0.0}

    def mid_write() -> bool:
        if (save / "iter_0000002").is_dir() and partial.is_dir() and not state["seen"]:
            state["seen"] = time.monotonic()
        return bool(state["seen"]) and time.monotonic() - state["seen"] > 1.0

    _run_then_kill(tmp_path, mid_write, ray_dir, **{DELAY_ENV: "6"})
    assert partial.is_dir() and not (save / "iter_0000004").exists()
    resumed = ckpt.load_resume_point(save, _saved_fingerprint(save))
    assert resumed.iteration == 2
    _check_lineage(_resume(tmp_path, ray_dir), resumed, save)
    assert not partial.exists() and (save / "iter_0000004" / ckpt.MANIFEST).is_file()


def _saved_fingerprint(save: Path) -> dict[str, Any]:
    latest = ckpt.find_latest(save)
    assert latest is not None, "no complete checkpoint was written before the kill"
    fingerprint: dict[str, Any] = json.loads((latest / ckpt.MANIFEST).read_text())["fingerprint"]
    return fingerprint


HYBRID = tuple(k for k in TINY if not k.startswith(("asp_config.", "async_config."))) + (
    "megatron_training.train_iters=4",
)


def test_hybrid_resume_skips_the_consumed_batches(tmp_path: Path) -> None:
    """The hybrid loop redraws its batches; a resumed run trains only those after the checkpoint."""
    ray_dir = tempfile.mkdtemp(prefix="rk", dir="/tmp")
    base = [
        sys.executable, str(ROOT / "cli" / "train_grpo.py"), "--config-name", "grpo_tiny_cpu",
        f"run_dir={tmp_path / 'runs'}", f"megatron_training.tokenizer_name_or_path={tmp_path / 'model'}",
        f"++actor_config.save={tmp_path / 'save'}", *HYBRID,
    ]  # fmt: skip
    for extra in ((), (f"++actor_config.load={tmp_path / 'save'}",)):
        if extra:  # as if the first run had died between its two checkpoints
            shutil.rmtree(tmp_path / "save" / "iter_0000004")
        proc = subprocess.run(
            [*base, *extra], cwd=tmp_path, env=_env(ray_dir), capture_output=True, text=True, timeout=900
        )
        _kill_leftover_ray(ray_dir)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    first, second = sorted((tmp_path / "runs").iterdir())
    steps = [
        [json.loads(line) for line in (d / ckpt.CONSUMED_LOG).read_text().splitlines()]
        for d in (first, second)
    ]
    assert [s["iteration"] for s in steps[1]] == [2, 3]
    assert steps[1] == steps[0][2:]  # the same batches the uninterrupted run trained
    summary = json.loads((second / "summary.json").read_text())
    assert (summary["resumed_from_iteration"], summary["prompts_consumed_total"]) == (2, 16)
    assert summary["prompts_consumed"] == 8
