"""CPU the driver and the Control Unit burn while the trainer waits for a global batch.

On a small host the rollout engines want every core, so whatever the control plane spends while
the trainer is idle comes out of generation. This compares the two ways the driver can wait:

* ``poll``: ``pop_global_batch`` every 20 ms (what the async trainer did before the long-poll);
* ``long_poll``: ``wait_global_batch`` blocking in the CU, waking every 0.5 s to check the GUs.

A real ``ControlUnit`` Ray actor with a schedule but no GU, so no batch ever becomes ready and
the driver waits for the whole window. CPU seconds of the driver, the CU actor and Ray's raylet
and GCS are read from /proc (psutil); each number is the median of ``--repeats`` windows::

    .venv/bin/python benchmarks/trainer_wait_cpu.py --json runs/trainer_wait_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil
import ray

from mindspeed_rl.runtime.config import RuntimeConfig
from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.workers.control_unit import ControlUnit

POLL_SECONDS = 0.02
"""The period of the polling driver this replaced (it no longer exists in the trainer)."""
GU_CHECK_SECONDS = 0.5
"""How often the long-polling driver of this comparison wakes to check its GUs (the trainer
reaps dead GUs in a watcher thread and has no such period)."""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="length of one waiting window")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the results here (also printed)")
    return p.parse_args()


def _schedule() -> list[ScheduledMinibatch]:
    return [
        ScheduledMinibatch(
            minibatch_id=i,
            prompt_ids=(f"p{2 * i}", f"p{2 * i + 1}"),
            batch_group_id=i,
            predicted_load=1.0,
            order_index=i,
        )
        for i in range(4)
    ]


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for proc in processes:
        times = proc.cpu_times()
        total += times.user + times.system
    return total


def _ray_daemons() -> list[psutil.Process]:
    names = ("raylet", "gcs_server")
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] in names]


def _wait(cu: Any, mode: str, seconds: float) -> int:
    """Wait like the driver does for ``seconds``; returns the number of RPCs made."""
    deadline, calls = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        if mode == "poll":
            assert ray.get(cu.pop_global_batch.remote(0)) is None
            time.sleep(POLL_SECONDS)
        else:
            timeout = min(GU_CHECK_SECONDS, max(0.0, deadline - time.monotonic()))
            assert ray.get(cu.wait_global_batch.remote(0, timeout)) is None
        calls += 1
    return calls


def measure(cu: Any, processes: list[psutil.Process], mode: str, seconds: float) -> dict[str, float]:
    before, start = _cpu_seconds(processes), time.monotonic()
    calls = _wait(cu, mode, seconds)
    wall = time.monotonic() - start
    cpu = _cpu_seconds(processes) - before
    return {"wall_s": wall, "cpu_s": cpu, "cores_busy": cpu / wall, "rpcs": float(calls)}


def main() -> int:
    args = parse_args()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        config = RuntimeConfig(
            num_prompts_per_global_batch=4,
            num_samples_per_prompt=2,
            queue_max_samples=16,
            queue_resume_samples=8,
        )
        cu = ray.remote(ControlUnit).options(max_concurrency=32).remote(config, _schedule())
        cu_pid = ray.get(cu.__ray_call__.remote(lambda _self: os.getpid()))
        processes = [psutil.Process(os.getpid()), psutil.Process(cu_pid), *_ray_daemons()]
        results: dict[str, Any] = {}
        for mode in ("poll", "long_poll"):
            windows = [measure(cu, processes, mode, args.seconds) for _ in range(args.repeats)]
            results[mode] = {
                key: statistics.median(w[key] for w in windows)
                for key in ("wall_s", "cpu_s", "cores_busy", "rpcs")
            }
            results[mode]["windows"] = windows
    finally:
        ray.shutdown()
    report = {
        "seconds_per_window": args.seconds,
        "repeats": args.repeats,
        "host_cpus": os.cpu_count(),
        **results,
    }
    for mode in ("poll", "long_poll"):
        r = results[mode]
        print(
            f"{mode:9s}: {r['cores_busy']:.3f} cores busy over {r['wall_s']:.1f} s ({r['rpcs']:.0f} RPCs), median of {args.repeats}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
