"""Run untrusted Python in a separate, limited process, or on a SandboxFusion server.

The local sandbox is for tests, demos and single-user runs; production users point
``sandbox_fusion_url`` at a SandboxFusion deployment. Each call gets:

* its own process group, killed whole (``SIGKILL``) at the wall-clock timeout, so children it
  spawned do not outlive the call;
* ``RLIMIT_CPU`` (CPU seconds), ``RLIMIT_AS`` (``memory_limit_mb``), ``RLIMIT_FSIZE`` (caps files
  it writes, stdout and stderr included) and no core dumps;
* a fresh scratch directory as its working directory and ``HOME``, removed afterwards;
* a stripped environment and ``python -I`` (no user site, no PYTHON* variables);
* no network: its own network namespace through ``unshare --net --map-root-user`` where the OS
  allows unprivileged user namespaces. Where it does not, the sandbox refuses to run unless the
  tool config says ``isolate_network: false``.

What it does not protect against: reading files the user running the trainer can read, kernel
exploits, or exhausting the process table (there is no per-call PID limit without cgroups).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxLimits:
    timeout_s: float = 30.0
    """Wall-clock seconds before the whole process group is killed."""
    memory_limit_mb: int = 1024
    """Address-space limit of the process (RLIMIT_AS)."""
    cpu_limit_s: int | None = None
    """CPU seconds (RLIMIT_CPU); None = the timeout rounded up."""
    max_output_bytes: int = 64 * 1024
    """Largest stdout/stderr (and any file) a call may write."""
    isolate_network: bool = True

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.memory_limit_mb < 16 or self.max_output_bytes < 1:
            raise ValueError(
                f"sandbox limits {self}: timeout_s must be > 0, memory_limit_mb >= 16 and max_output_bytes >= 1"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """SandboxFusion's ``run_result`` fields, so both back ends answer the same way."""

    status: str
    """"Finished", "TimeLimitExceeded" or "SandboxError"."""
    return_code: int | None
    stdout: str
    stderr: str
    execution_time: float

    @property
    def ok(self) -> bool:
        return self.status == "Finished" and self.return_code == 0


@functools.cache
def network_namespace_available() -> bool:
    """Whether ``unshare --net --map-root-user`` works for this user (probed once)."""
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(
            ["unshare", "--net", "--map-root-user", "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _limit(limits: SandboxLimits) -> None:
    """Runs in the child between fork and exec: only async-signal-safe-ish calls."""
    cpu = limits.cpu_limit_s if limits.cpu_limit_s is not None else int(limits.timeout_s) + 1
    memory = limits.memory_limit_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_output_bytes, limits.max_output_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_python_locally(code: str, limits: SandboxLimits) -> RunResult:
    """Execute ``code`` under ``limits``; never raises for anything the code does."""
    prefix: list[str] = []
    if limits.isolate_network:
        if not network_namespace_available():
            raise RuntimeError(
                "the code sandbox cannot isolate the network here (unshare --net --map-root-user failed: "
                "unprivileged user namespaces are off); point sandbox_fusion_url at a SandboxFusion server, "
                "or set isolate_network: false in the tool config to run code with network access"
            )
        prefix = ["unshare", "--net", "--map-root-user"]
    with (
        tempfile.TemporaryDirectory(prefix="msrl-sandbox-") as scratch,
        tempfile.TemporaryDirectory(prefix="msrl-sandbox-io-") as io_dir,
    ):
        work = Path(scratch)
        (work / "main.py").write_text(code)
        out_path, err_path = Path(io_dir) / "stdout", Path(io_dir) / "stderr"
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        started = time.monotonic()
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                [*prefix, sys.executable, "-I", "main.py"],
                cwd=scratch,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group: one killpg ends every child
                preexec_fn=functools.partial(_limit, limits),
            )
            timed_out = False
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            # Kill the group either way: a finished parent may have left children running.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        elapsed = time.monotonic() - started
        stdout = _read_capped(out_path, limits.max_output_bytes)
        stderr = _read_capped(err_path, limits.max_output_bytes)
    if timed_out:
        return RunResult(
            status="TimeLimitExceeded",
            return_code=None,
            stdout=stdout,
            stderr=stderr + f"\nTimeoutError: execution exceeded {limits.timeout_s:g} s and was killed",
            execution_time=elapsed,
        )
    code_ = proc.returncode
    if code_ < 0:
        stderr += f"\nKilled by signal {signal.Signals(-code_).name} (a resource limit was exceeded)"
    return RunResult(
        status="Finished", return_code=code_, stdout=stdout, stderr=stderr, execution_time=elapsed
    )


def _read_capped(path: Path, cap: int) -> str:
    with path.open("rb") as f:
        data = f.read(cap + 1)
    text = data[:cap].decode("utf-8", errors="replace")
    return text + ("\n[output truncated]" if len(data) > cap else "")


def run_code_on_sandbox_fusion(url: str, code: str, *, language: str, limits: SandboxLimits) -> RunResult:
    """POST to a SandboxFusion ``run_code`` endpoint (its request and response shapes)."""
    body = json.dumps(
        {
            "code": code,
            "language": language,
            "run_timeout": limits.timeout_s,
            "memory_limit_MB": limits.memory_limit_mb,
        }
    ).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        # The server enforces run_timeout; the extra margin covers queueing and transfer.
        with urllib.request.urlopen(request, timeout=limits.timeout_s + 30) as response:
            payload = json.loads(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return RunResult(
            status="SandboxError",
            return_code=None,
            stdout="",
            stderr=f"SandboxError: the sandbox at {url} did not answer ({exc})",
            execution_time=time.monotonic() - started,
        )
    run = payload.get("run_result") or {}
    status = str(run.get("status") or payload.get("status") or "SandboxError")
    if status not in ("Finished", "TimeLimitExceeded"):
        message = payload.get("message") or run.get("stderr") or status
        return RunResult(
            status="SandboxError",
            return_code=run.get("return_code"),
            stdout=str(run.get("stdout") or ""),
            stderr=f"SandboxError: {message}",
            execution_time=float(run.get("execution_time") or 0.0),
        )
    return RunResult(
        status=status,
        return_code=run.get("return_code"),
        stdout=str(run.get("stdout") or ""),
        stderr=str(run.get("stderr") or ""),
        execution_time=float(run.get("execution_time") or 0.0),
    )
