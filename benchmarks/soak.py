"""Soak test of the async pipeline: many iterations with injected faults, RSS of every process.

Runs ``cli/train_grpo.py`` on the tiny async config (HF rollout engine, small batches) with a
fault every ``--fault-every-s`` seconds on average, spread over the run as
``MINDSPEED_RL_TEST_FAULTS`` items (kill, raise or hang of a random actor at one of its
minibatches; the GU counts an actor slot's minibatches across its replacements). While it runs,
the RSS of the driver and every process under it (Ray's raylet starts the CU, GU, actor and TU
workers) is sampled; at the end each process's RSS slope per 100 iterations is fitted against
the iteration count read from ``metrics.jsonl``. Prints and writes one JSON::

    .venv/bin/python benchmarks/soak.py --iters 300 --json runs/soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

# The long-answer demo task these figures were measured on (the shipped demo config now runs
# builtin:demo_short with 32-token answers).
LONG_TASK = ("megatron_training.data_path=builtin:demo", "generate_config.sampling_config.max_tokens=160")


ROOT = Path(__file__).resolve().parents[1]
PROCESS_WARMUP_SAMPLES = 10  # 20 s of 2 s samples
ROLES = ("GenerationActor", "GenerationUnit", "ControlUnit", "TrainingUnit")


def overrides(iters: int, gus: int, actors: int, run_dir: Path, model: Path) -> list[str]:
    """2 prompts per step x 4 samples, minibatches of 1 prompt: each iteration is short."""
    return [
        *LONG_TASK, f"run_dir={run_dir}", f"megatron_training.tokenizer_name_or_path={model}",
        f"megatron_training.train_iters={iters}", "megatron_training.global_batch_size=2",
        "rl_config.mini_batch_size=2", "rl_config.n_samples_per_prompt=4",
        "actor_config.micro_batch_size=8", "rl_config.actor_forward_micro_batch_size=8",
        "rl_config.ref_forward_micro_batch_size=8", "warmup_config.steps=5",
        "asp_config.b=1", "asp_config.kappa=0", "asp_config.k=2", "asp_config.sa_iterations=1000",
        "async_config.queue_max_samples=16", "async_config.queue_resume_samples=8",
        "async_config.gu_queue_low=1", "async_config.gu_queue_high=2",
        f"async_config.num_generation_units={gus}", f"async_config.actors_per_unit={actors}",
        "async_config.minibatch_timeout_s=20", "async_config.stall_timeout_s=180",
        "async_config.actor_max_restarts=1000", "async_config.minibatch_max_attempts=5",
        "generate_config.sampling_config.max_tokens=16", "rl_config.rollout_backend=hf",
        "rl_config.use_tensorboard=false", "megatron_training.save_interval=100000",
    ]  # fmt: skip


def fault_items(args: argparse.Namespace, rng: random.Random) -> list[str]:
    """About one fault per ``fault_every_s`` seconds, at actor-minibatch counts spread over the run
    (each actor takes about iters x prompts-per-step / actors minibatches of one prompt)."""
    num_actors = args.gus * args.actors
    per_actor = args.iters * 2 // num_actors
    num_faults = max(1, int(args.expected_s / args.fault_every_s))
    items = []
    for _ in range(num_faults):
        g, a = rng.randrange(args.gus), rng.randrange(args.actors)
        n = rng.randrange(3, max(4, per_actor - 2))
        items.append(f"{rng.choice(['actor', 'raise', 'hang'])}:{g}:{a}:{n}")
    return items


def role(proc: psutil.Process) -> str | None:
    try:
        title = " ".join(proc.cmdline())
    except psutil.Error:
        return None
    return next((r for r in ROLES if f"ray::{r}" in title), None)


def sample(driver: psutil.Process, samples: list[dict[str, Any]], t: float) -> None:
    try:
        procs = [driver, *driver.children(recursive=True)]
    except psutil.Error:
        return
    for proc in procs:
        name = "driver" if proc.pid == driver.pid else role(proc)
        if name is None:
            continue
        try:
            samples.append({"t": t, "pid": proc.pid, "role": name, "rss_mb": proc.memory_info().rss / 2**20})
        except psutil.Error:
            continue


def slope_per_100(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of RSS (MB) against iteration, per 100 iterations."""
    if len(points) < 3:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return None if var == 0 else 100 * sum((x - mx) * (y - my) for x, y in points) / var


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--gus", type=int, default=2)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--fault-every-s", type=float, default=30.0)
    parser.add_argument("--expected-s", type=float, default=600.0, help="expected run time (spreads faults)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "soak")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    runs = args.work / f"runs_{int(time.time())}"
    faults = fault_items(args, random.Random(args.seed))
    cmd = [sys.executable, str(ROOT / "cli" / "train_grpo.py"), "--config-name", "grpo_tiny_asp",
           *overrides(args.iters, args.gus, args.actors, runs, args.work / "model")]  # fmt: skip
    env = {**os.environ, "MINDSPEED_RL_TEST_FAULTS": ",".join(faults)}
    log = (args.work / "soak.log").open("w")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=args.work, stdout=log, stderr=subprocess.STDOUT, env=env)
    driver = psutil.Process(proc.pid)
    samples: list[dict[str, Any]] = []
    progress: list[tuple[float, int]] = []
    while proc.poll() is None:
        t = time.monotonic() - started
        sample(driver, samples, t)
        metrics = next(runs.glob("*/metrics.jsonl"), None) if runs.is_dir() else None
        done = len(metrics.read_text().splitlines()) if metrics is not None and metrics.is_file() else 0
        progress.append((t, done))
        time.sleep(2.0)
    report = summarize(args, faults, proc.returncode, time.monotonic() - started, runs, samples, progress)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


def summarize(
    args: argparse.Namespace,
    faults: list[str],
    rc: int,
    seconds: float,
    runs: Path,
    samples: list[dict[str, Any]],
    progress: list[tuple[float, int]],
) -> dict[str, Any]:
    def iteration_at(t: float) -> int:
        return max((done for pt, done in progress if pt <= t), default=0)

    per_process: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for s in samples:
        it = iteration_at(s["t"])
        if it >= 5:  # after warm-up: engines, allocator pools and caches are filled by then
            per_process[(s["role"], s["pid"])].append((float(it), s["rss_mb"]))
    # A replacement actor starts mid-run: its own first samples are engine start-up, not growth.
    per_process = {key: pts[PROCESS_WARMUP_SAMPLES:] for key, pts in per_process.items()}
    # A process that lived too briefly after its warm-up (a replaced actor) has no slope to fit.
    short = sorted(f"{r}/{pid}" for (r, pid), pts in per_process.items() if len(pts) < 3)
    per_process = {key: pts for key, pts in per_process.items() if len(pts) >= 3}
    slopes = {
        f"{r}/{pid}": {
            "slope_mb_per_100_iters": slope_per_100(pts),
            "rss_mb_last": pts[-1][1],
            "samples": len(pts),
        }
        for (r, pid), pts in sorted(per_process.items())
    }
    summary_path = next(runs.glob("*/summary.json"), None) if runs.is_dir() else None
    summary = json.loads(summary_path.read_text()) if summary_path is not None else {}
    keys = ("prompts_scheduled", "prompts_consumed", "duplicate_minibatches_dropped", "minibatches_reissued",
            "minibatches_timed_out", "minibatch_errors", "actor_deaths", "actor_restarts",
            "max_queue_depth_samples", "queue_bound_samples", "control_cpu_ms_per_minibatch")  # fmt: skip
    lost = summary.get("prompts_scheduled", 0) - summary.get("prompts_consumed", 0) if summary else None
    return {
        "iters": args.iters, "returncode": rc, "seconds": seconds, "faults_planned": faults,
        "prompts_lost": lost, **{k: summary.get(k) for k in keys}, "rss": slopes,
        "rss_too_short_to_fit": short,
    }  # fmt: skip


if __name__ == "__main__":
    main()
