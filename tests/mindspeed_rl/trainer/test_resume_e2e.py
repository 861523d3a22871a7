"""Crash and resume end to end: the real CLI in its own process group, killed with SIGKILL, then
rerun with ``actor_config.load=<save dir>``; exactly-once per prompt is proven across the lineage.

Each run that is killed gets its own Ray temp dir (``RAY_TMPDIR``) and a local cluster
(``RAY_ADDRESS=local``), so it never joins another test's cluster, and its Ray processes are found
by that dir and killed by pid before the rerun. The reruns, which end by themselves, join the test
process's shared cluster (``_joined_env``).

Kill points are deterministic: the run is started with ``MINDSPEED_RL_TEST_CHECKPOINT_HOLD=4``
(``cli/checkpoint_hooks.py``), so its checkpoint after iteration 4 stops before its commit and never
completes; whenever the test kills it, the newest complete checkpoint is the one after iteration 2.
Where in the run the kill lands is drawn from a fixed seed.

One lineage serves both offline tests (module-scoped ``offline``): run A is killed after a seeded
number of iterations past its first checkpoint; run B resumes it and is killed while holding its
next checkpoint write; run C resumes again and finishes.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.checkpoint_hooks import HOLD_ENV
from mindspeed_rl.trainer import checkpointing as ckpt
from tests.support.cli_runs import run_cli
from tests.support.models import PolicyModels
from tests.support.ray_cluster import shared_cluster_env
from tests.support.shared_runs import HYBRID, HYBRID_ITERS, HYBRID_PROMPTS, HybridRun

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.integration, pytest.mark.slow]
TRAIN_ITERS, PROMPTS_PER_ITER = 6, 4
# The seed of the kill point: the same iteration every time (change it to try another).
KILL_SEED = 41
# The checkpoint after iteration 4 never commits (save_interval 2): at any kill, iteration 2 is the newest.
HELD_ITERATION = 4
HOLD = {HOLD_ENV: str(HELD_ITERATION)}
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
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", HOLD_ENV)}
    return {**env, "RAY_TMPDIR": ray_dir, "RAY_ADDRESS": "local", **extra}


def _joined_env() -> dict[str, str]:
    """A run that ends by itself (a resume): the test process's shared cluster, no hold."""
    return {k: v for k, v in shared_cluster_env().items() if k != HOLD_ENV}


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


def _iterations_done(run_dir: Path | None) -> int:
    log = None if run_dir is None else run_dir / "metrics.jsonl"
    return len(log.read_text().splitlines()) if log is not None and log.is_file() else 0


def _run_then_kill(
    tmp_path: Path, until: Callable[[Path | None, int], bool], ray_dir: str, *extra: str, **env: str
) -> Path:
    """Start the CLI in its own session, SIGKILL its whole process group once ``until(run dir,
    pid)`` holds (the run dir is None until the run made it); returns the killed run's directory."""
    runs = tmp_path / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    log_path = tmp_path / "killed.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        _command(tmp_path, *extra), cwd=tmp_path, env=_env(ray_dir, **env),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    run_dir = None
    try:
        while True:
            if run_dir is None and runs.is_dir():
                run_dir = next(iter(set(runs.iterdir()) - before), None)
            if until(run_dir, proc.pid):
                break
            assert proc.poll() is None, "the run ended before the kill:\n" + log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, "timed out waiting for the kill point"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        _kill_leftover_ray(ray_dir)
        log.close()
    assert run_dir is not None
    return run_dir


def _resume(tmp_path: Path) -> Path:
    before = set((tmp_path / "runs").iterdir())
    proc = subprocess.run(
        _command(tmp_path, f"++actor_config.load={tmp_path / 'save'}"), cwd=tmp_path, env=_joined_env(),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
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


def _held_by(partial: Path, pid: int) -> bool:
    """Whether process ``pid`` (the CLI: the driver) is holding the write into ``partial``."""
    try:
        return (partial / ckpt.HOLD_MARKER).read_text().strip() == str(pid)
    except OSError:
        return False


def _saved_fingerprint(save: Path) -> dict[str, Any]:
    latest = ckpt.find_latest(save)
    assert latest is not None, "no complete checkpoint was written before the kill"
    fingerprint: dict[str, Any] = json.loads((latest / ckpt.MANIFEST).read_text())["fingerprint"]
    return fingerprint


@dataclass(frozen=True, slots=True, kw_only=True)
class OfflineLineage:
    save: Path
    kill_after: int
    """Iterations run A had logged when the test killed it (drawn from ``KILL_SEED``)."""
    killed_a_iterations: int
    resumed_a: ckpt.ResumePoint
    """What run B resumed from: A's newest complete checkpoint."""
    b_partial_files: frozenset[str]
    """What run B's held write (the checkpoint after iteration 4) had left when B was killed."""
    b_committed_4: bool
    resumed_b: ckpt.ResumePoint
    """What run C resumed from after B's kill."""
    run_c: Path


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory, policy_models: PolicyModels) -> OfflineLineage:
    tmp_path = tmp_path_factory.mktemp("resume")
    policy_models.provide(tmp_path / "model", "grpo_tiny_asp", TINY)
    save = tmp_path / "save"
    ray_dir = tempfile.mkdtemp(prefix="rk", dir="/tmp")
    # A: killed once it has logged 2 or 3 iterations (its first checkpoint is complete by then).
    kill_after = random.Random(KILL_SEED).randint(2, 3)
    print(f"killing run A after iteration {kill_after} (seed {KILL_SEED})")
    run_a = _run_then_kill(
        tmp_path,
        lambda run_dir, _: ckpt.find_latest(save) is not None and _iterations_done(run_dir) >= kill_after,
        ray_dir,
        **HOLD,
    )
    resumed_a = ckpt.load_resume_point(save, _saved_fingerprint(save))
    # B: resumes A, trains iterations 2 and 3, and is killed holding the write after iteration 4
    # (its own hold: A may have reached the same one before its kill, leaving a marker of its pid).
    partial = save / f".iter_{HELD_ITERATION:07d}.partial"
    _run_then_kill(
        tmp_path, lambda _, pid: _held_by(partial, pid), ray_dir, f"++actor_config.load={save}", **HOLD
    )
    b_partial_files = frozenset(p.name for p in partial.iterdir())
    b_committed_4 = (save / f"iter_{HELD_ITERATION:07d}").exists()
    resumed_b = ckpt.load_resume_point(save, _saved_fingerprint(save))
    # C: resumes what B left and finishes the run.
    run_c = _resume(tmp_path)
    return OfflineLineage(
        save=save, kill_after=kill_after, killed_a_iterations=_iterations_done(run_a), resumed_a=resumed_a,
        b_partial_files=b_partial_files, b_committed_4=b_committed_4, resumed_b=resumed_b, run_c=run_c,
    )  # fmt: skip


def test_sigkill_after_a_checkpoint_then_resume_consumes_every_prompt_once(offline: OfflineLineage) -> None:
    # A trained past its first checkpoint (iterations it logged after it are trained again).
    assert offline.kill_after <= offline.killed_a_iterations <= HELD_ITERATION
    resumed = offline.resumed_a
    assert resumed.iteration == 2 and len(resumed.prompts_consumed) == resumed.iteration * PROMPTS_PER_ITER
    _check_lineage(offline.run_c, resumed, offline.save)


def test_sigkill_during_a_checkpoint_write_keeps_the_previous_one(offline: OfflineLineage) -> None:
    # B was killed between the held write's files and its commit: no manifest, no rename.
    assert {ckpt.HOLD_MARKER, ckpt.PIPELINE_STATE, ckpt.SCHEDULE} <= offline.b_partial_files
    assert ckpt.MANIFEST not in offline.b_partial_files and not offline.b_committed_4
    assert offline.resumed_b.iteration == 2 and offline.resumed_b.folder == offline.resumed_a.folder
    _check_lineage(offline.run_c, offline.resumed_b, offline.save)
    partial = offline.save / f".iter_{HELD_ITERATION:07d}.partial"
    assert not partial.exists() and (offline.save / f"iter_{HELD_ITERATION:07d}" / ckpt.MANIFEST).is_file()


def test_hybrid_resume_skips_the_consumed_batches(hybrid_run: HybridRun, tmp_path: Path) -> None:
    """The hybrid loop redraws its batches; a resumed run trains only those after the checkpoint.

    The first run is the session's shared hybrid run (``conftest.hybrid_run``, checkpoints after
    iterations 2, 4 and 6); its checkpoints are copied here without the last one, as if it had died
    between its last two. The rerun decodes on the light HF engine: the rollout engine is not part
    of what a checkpoint must match, and the batches drawn do not depend on it."""
    save = tmp_path / "save"
    shutil.copytree(hybrid_run.save, save)
    shutil.rmtree(save / f"iter_{HYBRID_ITERS:07d}")
    shutil.copytree(hybrid_run.workdir / "model", tmp_path / "model")
    resumed = run_cli(
        tmp_path, "grpo_tiny_cpu",
        (*HYBRID, "rl_config.rollout_backend=hf", f"actor_config.save={save}", f"actor_config.load={save}"),
        env=_joined_env(), timeout=600,
    )  # fmt: skip
    steps = [
        [json.loads(line) for line in (d / ckpt.CONSUMED_LOG).read_text().splitlines()]
        for d in (hybrid_run.run.run_dir, resumed.run_dir)
    ]
    last = HYBRID_ITERS - 2  # the newest checkpoint left
    assert [s["iteration"] for s in steps[1]] == [last, last + 1]
    assert steps[1] == steps[0][last:]  # the same batches the uninterrupted run trained
    summary = resumed.summary()
    assert (summary["resumed_from_iteration"], summary["prompts_consumed_total"]) == (
        last,
        HYBRID_ITERS * HYBRID_PROMPTS,
    )
    assert summary["prompts_consumed"] == 2 * HYBRID_PROMPTS
