"""CPU of Ray's log monitor in a long-lived cluster that has outlived many workers.

The test suite keeps one Ray cluster for hundreds of runs (``tests/support/ray_cluster.py``); each
run's actors leave two log files behind. Ray's log monitor (ray 2.60, ``_private/log_monitor.py``)
globs the log folder every 0.1 s while it names under ``RAY_LOG_MONITOR_MANY_FILES_THRESHOLD``
(1,000) files, and reads every open file each pass, dead workers' included, until
``RAY_LOG_MONITOR_MAX_OPEN_FILES`` (200) are open. This starts a fresh local cluster per setting,
creates and kills ``--actors`` actors (10 at a time, each printing a line that reaches the driver),
then measures the monitor's CPU over ``--idle-s`` seconds of an idle cluster::

    .venv/bin/python benchmarks/ray_log_monitor.py --json runs/ray_log_monitor.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SETTINGS: dict[str, dict[str, str]] = {
    "ray_defaults": {},
    "rescan_every_0.5s": {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"},
    "max_open_40": {"RAY_LOG_MONITOR_MAX_OPEN_FILES": "40"},
    "both (the suite's cluster)": {
        "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
        "RAY_LOG_MONITOR_MAX_OPEN_FILES": "40",
    },
}

CHILD = """
import json, os, sys, time
import psutil, ray
actors_total, idle_s = int(sys.argv[1]), float(sys.argv[2])
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)

@ray.remote(num_cpus=0)
class Printer:
    def hello(self):
        print("hello from", os.getpid())
        return os.getpid()

session = ray._private.worker._global_node.get_session_dir_path()
def named(p):
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""
(monitor,) = [p for p in psutil.process_iter() if "log_monitor" in named(p) and session in named(p)]
cpu = lambda: sum(monitor.cpu_times()[:2])
c0 = cpu()
for _ in range(actors_total // 10):
    wave = [Printer.remote() for _ in range(10)]
    ray.get([a.hello.remote() for a in wave])
    for a in wave:
        ray.kill(a)
c1, t1 = cpu(), time.monotonic()
time.sleep(idle_s)
c2, t2 = cpu(), time.monotonic()
logs = os.path.join(session, "logs")
old = os.path.join(logs, "old")
print("RESULT " + json.dumps({
    "churn_cpu_s": round(c1 - c0, 2),
    "idle_cpu_s": round(c2 - c1, 2),
    "idle_percent_of_a_core": round(100 * (c2 - c1) / (t2 - t1), 2),
    "files_in_logs": len(os.listdir(logs)),
    "files_swept_to_old": len(os.listdir(old)) if os.path.isdir(old) else 0,
}))
ray.shutdown()
"""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--actors", type=int, default=150, help="actors created and killed before measuring")
    p.add_argument("--idle-s", type=float, default=30.0, help="length of the idle window measured")
    p.add_argument("--json", type=Path, help="write the results here (also printed)")
    return p.parse_args()


def measure(env: dict[str, str], actors: int, idle_s: float) -> dict[str, Any]:
    # A fresh interpreter per setting: Ray reads these variables when it starts the monitor.
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_LOG_MONITOR") and k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(actors), str(idle_s)],
        env={**base, **env}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def main() -> int:
    args = parse_args()
    report = {
        "actors": args.actors,
        "idle_s": args.idle_s,
        "settings": {
            name: {"env": env, **measure(env, args.actors, args.idle_s)} for name, env in SETTINGS.items()
        },
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
