"""One Ray cluster per test process, joined by the CLI runs that need no cluster of their own.

A CLI run that starts its own local cluster pays for Ray's head and agent processes and their idle
workers every time: about 5 s of wall time and 6 s of CPU of a 22 s tiny run on the 2-core host
(docs/benchmarks/test-suite.md). The runs that go through ``shared_cluster_env`` join this
process's cluster instead, as a user's run joins one named by ``RAY_ADDRESS`` (``utils/ray_setup``,
case 1); each run is still its own Ray job, whose actors Ray stops when its driver exits. Tests
that drive Ray from the test process itself join it the same way (``init_in_process``).

Runs that check what a run leaves behind, SIGKILL their driver, run the launcher or give roles
other interpreters keep starting a cluster of their own (they do not call this): their subject is
the cluster's life around the run.

The cluster is started the way the CLI starts a local one (``ray.init(address="local")`` with the
host's usable cores, no dashboard), by a small host process under a temp root of its own, so no
bootstrap file announces it to runs that did not ask for it; it ends with the test process
(``stop`` from ``pytest_unconfigure``, or when the host sees its parent gone).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# The host: start the cluster, print its GCS address, stay until told to stop or orphaned.
_HOST = """
import os, signal, sys, time
import ray
from mindspeed_rl.utils.ray_setup import local_cpu_count
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # exit through atexit: ray.shutdown()
ray.init(address="local", num_cpus=local_cpu_count(), include_dashboard=False)
print("GCS_ADDRESS=" + ray.get_runtime_context().gcs_address, flush=True)
parent = os.getppid()
while os.getppid() == parent:
    time.sleep(1.0)
"""
START_TIMEOUT_S = 120.0
# ``0``: no shared cluster, every run starts its own (to compare the two, or to rule the cluster out).
SWITCH_ENV = "MINDSPEED_RL_TEST_SHARED_CLUSTER"

# The cluster outlives hundreds of runs' workers. Ray's log monitor (ray 2.60, _private/log_monitor.py)
# globs the log folder 10 times a second while it holds under 1,000 names, and polls every open
# file, dead workers' included until 200 are open; here it rescans twice a second and sweeps dead
# workers' files out at 40. After 150 short-lived actors its idle CPU was 3.3 % of a core before,
# 1.5 % after (benchmarks/ray_log_monitor.py). New files are still found within 0.5 s.
LOG_MONITOR_ENV = {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0", "RAY_LOG_MONITOR_MAX_OPEN_FILES": "40"}

_host: subprocess.Popen[str] | None = None
_env: dict[str, str] | None = None


def shared_cluster_env() -> dict[str, str]:
    """``os.environ`` plus ``RAY_ADDRESS`` (and token mode) of this process's shared cluster,
    started on the first call."""
    global _host, _env
    if os.environ.get(SWITCH_ENV) == "0":
        return dict(os.environ)  # every run starts its own cluster, as before
    if _env is None:
        root = tempfile.mkdtemp(prefix="s-", dir=os.environ.get("RAY_TMPDIR"))  # short socket paths
        repo = str(Path(__file__).resolve().parents[2])
        env = {
            **os.environ,
            "RAY_TMPDIR": root,
            **LOG_MONITOR_ENV,
            "PYTHONPATH": os.pathsep.join(filter(None, (repo, os.environ.get("PYTHONPATH")))),
        }
        log = Path(root) / "host.log"  # Ray's start-up messages; quoted if the start fails
        with log.open("w") as err:
            _host = subprocess.Popen(
                [sys.executable, "-c", _HOST], stdout=subprocess.PIPE, stderr=err, text=True, env=env
            )
        address = _read_address(_host, log)
        # Ray's rule for an explicit address: the driver sends the token only in token mode
        # (utils/ray_auth.py); a local ray.init() runs with tokens on.
        _env = {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "token"}
    return {**os.environ, **_env}


def init_in_process(**kwargs: Any) -> None:
    """``ray.init`` for a test that drives Ray from the test process itself: joins this process's
    shared cluster, as a job of its own (``ray.shutdown`` ends the job and its actors), instead of
    starting a cluster per test module. ``kwargs`` are ray.init's; the ones that only size a new
    local cluster (``num_cpus``, ``include_dashboard``) apply when the switch is off."""
    import ray

    if os.environ.get(SWITCH_ENV) == "0":
        ray.init(address="local", **kwargs)
        return
    from ray._raylet import Config

    address = shared_cluster_env()["RAY_ADDRESS"]
    # The cluster runs with tokens (a local ray.init's default); joining it by address sends the
    # token only in token mode, which ray 2.60 reads from its cached config: set the variable, then
    # refresh the cache (what its own authentication_token_setup._enable_token_auth does).
    os.environ["RAY_AUTH_MODE"] = "token"
    Config.initialize("")
    joined = {k: v for k, v in kwargs.items() if k not in ("num_cpus", "include_dashboard")}
    ray.init(address=address, **joined)


def _read_address(host: subprocess.Popen[str], log: Path) -> str:
    """The host's ``GCS_ADDRESS=`` line (anything else it prints first is skipped)."""
    import selectors
    import time

    assert host.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    with selectors.DefaultSelector() as sel:
        sel.register(host.stdout, selectors.EVENT_READ)
        while sel.select(timeout=max(0.0, deadline - time.monotonic())):
            line = host.stdout.readline()
            if not line:  # the host exited
                break
            if line.startswith("GCS_ADDRESS="):
                return line.removeprefix("GCS_ADDRESS=").strip()
    host.kill()
    raise RuntimeError(
        f"the shared test cluster did not start (its host's exit code {host.wait()}, limit {START_TIMEOUT_S:g} s); "
        f"its log {log}:\n{log.read_text()[-3000:]}"
    )


def stop() -> None:
    """Stop this process's shared cluster, if one was started."""
    global _host, _env
    if _host is not None:
        _host.terminate()
        try:
            _host.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _host.kill()
            _host.wait()
    _host, _env = None, None
