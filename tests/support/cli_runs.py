"""Running the CLI entry points from end-to-end tests, and reading back what a run wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    ``<workdir>/model`` unless ``overrides`` name another."""
    cmd = [
        sys.executable, str(ROOT / "cli" / entry), "--config-name", config_name, f"run_dir={workdir / runs}",
        f"megatron_training.tokenizer_name_or_path={workdir / 'model'}", *overrides,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=dict(env or os.environ)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (run_dir,) = list((workdir / runs).iterdir())
    return CliRun(run_dir=run_dir, stdout=proc.stdout, stderr=proc.stderr)
