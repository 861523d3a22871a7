"""Running the CLI entry points from end-to-end tests, and reading back what a run wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True, kw_only=True)
class CliRun:
    """One finished CLI run: its directory and what it printed."""

    run_dir: Path
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = json.loads((self.run_dir / "summary.json").read_text())
        return summary

    def jsonl(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.run_dir / name).read_text().splitlines()]


def run_cli(
    workdir: Path,
    config_name: str,
    overrides: Sequence[str],
    *,
    entry: str = "train_grpo.py",
    runs: str = "runs",
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
) -> CliRun:
    """``python cli/<entry> --config-name <config_name> run_dir=<workdir>/<runs> <overrides>`` in
    ``workdir``; asserts it exits 0 and made exactly one run directory. The model folder is
    ``<workdir>/model`` unless ``overrides`` name another. Without ``env`` the run joins this test
    process's shared Ray cluster (``tests/support/ray_cluster.py``)."""
    from tests.support.ray_cluster import shared_cluster_env

    cmd = [
        sys.executable, str(ROOT / "cli" / entry), "--config-name", config_name, f"run_dir={workdir / runs}",
        f"megatron_training.tokenizer_name_or_path={workdir / 'model'}", *overrides,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout,
        env=dict(env) if env is not None else shared_cluster_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (run_dir,) = list((workdir / runs).iterdir())
    return CliRun(run_dir=run_dir, stdout=proc.stdout, stderr=proc.stderr)


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchedRun:
    """A CLI run whose descendant processes were recorded while it ran."""

    run_dir: Path | None
    returncode: int
    output: str
    descendants: frozenset[int]
    """The pid of every process seen below the CLI's (Ray's, the engines', their workers')."""


def run_watching_descendants(
    cmd: Sequence[str], cwd: Path, *, timeout_s: float, env: Mapping[str, str] | None = None
) -> WatchedRun:
    """Run ``cmd`` in ``cwd`` (output to ``cwd/run.log``), recording its descendants every 0.5 s."""
    import psutil

    seen: set[int] = set()
    log = cwd / "run.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            list(cmd), cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=dict(env or os.environ)
        )
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"run exceeded {timeout_s} s:\n{log.read_text()[-4000:]}")
            try:
                seen.update(child.pid for child in parent.children(recursive=True))
            except psutil.NoSuchProcess:
                break
            time.sleep(0.5)
    code = proc.wait()
    runs = [p for p in (cwd / "runs").iterdir()] if (cwd / "runs").is_dir() else []
    return WatchedRun(
        run_dir=runs[0] if len(runs) == 1 else None,
        returncode=code,
        output=log.read_text(),
        descendants=frozenset(seen),
    )


def survivors(pids: frozenset[int] | set[int], grace_s: float = 60.0) -> list[Any]:
    """The processes of ``pids`` still running once each has exited or ``grace_s`` has passed.

    Ray's teardown of its workers may lag the driver's exit: wait for each process to go (not a
    fixed sleep), a zombie counting as gone (it has exited; only its parent has not reaped it)."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    deadline = time.monotonic() + grace_s
    while True:
        alive = []
        for proc in procs:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        psutil.wait_procs(alive, timeout=0.5)
