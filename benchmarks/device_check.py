"""One prepared device check: the figures a first hour on one CUDA GPU should give, in one JSON.

``benchmarks/device_check.sh`` runs it on the device (Python 3.12, the device's own torch and
transformers, megatron-core from a carried wheel; no vLLM, no Ray, no network). Each stage runs
in a Python process of its own, under its own timeout, so a stage that fails, hangs or breaks the
CUDA context records its error and the next stage starts clean: a fresh interpreter on the device
(``--isolation exec``), a fork of the runner on CPU (``fork``: the runner imports torch, transformers
and megatron-core once, before any device runtime exists, instead of every stage again)::

    env             versions (Python, torch, CUDA, NCCL, transformers, megatron-core and where it
                    was imported from), the GPU, which optional packages are importable
    model           a random Qwen3 of the 0.6 B shape (tiny on CPU), saved as the HF folder the others load
    smoke_torch     gpu_smoke.py, torch engine: tokens/s, MFU, peak vs plan/memory.py's planned memory
    smoke_megatron  gpu_smoke.py, megatron TP1 with get_megatron_optimizer (bf16): the same figures
    dist_optimizer  megatron with use_distributed_optimizer and fp32 gradients: the same, and the dtypes
    checkpoint      save_state -> a fresh engine -> load_state: parameters and optimizer state bit-equal
    offload         workers/colocation.py's offload/onload on the real optimizer: device memory before,
                    offloaded and back; the state bit-equal after the cycle
    collective      weights/collective*.py: send_packed -> NCCL -> the GU's receiver, bit-equal
    delta           snapshot_io_delta's cases on the 0.6 B model stepped on the device at lr 1e-6
                    and 1e-5: changed fraction, delta vs full bytes and refresh seconds (issue #40)

::

    python -m benchmarks.device_check --device cuda --json OUT.json    # the GPU (what device_check.sh runs)
    python -m benchmarks.device_check --device cpu --json OUT.json     # tiny sizes on CPU (gloo): the code path
    python -m benchmarks.device_check --plan                           # the stages, timeouts and settings

Every stage runs with ``vllm`` and ``ray`` (and the other packages the device lacks, ``--block``)
made unimportable, as on the device, so a stage that reaches for them fails here as it would there.
The JSON: ``{"ok", "complete", "stages": {name: {"ok", "seconds", "figures", "error"}}, "settings",
...}``, rewritten after every stage.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    timeout_s: float
    """On the GPU at the full sizes; measured stages take well under it (README)."""
    needs: tuple[str, ...] = ()
    headline: tuple[str, ...] = ()
    """The figures the printed summary shows."""


STAGES = (
    Stage("env", 90, headline=("gpu", "torch", "megatron_core", "nccl")),
    Stage("model", 120, headline=("parameters", "seconds")),
    Stage("smoke_torch", 150, ("model",), ("tokens_per_s", "mfu", "peak_memory_gb", "planned_memory_gb")),
    Stage(
        "smoke_megatron",
        150,
        ("model",),
        ("tokens_per_s", "mfu", "peak_memory_gb", "planned_memory_gb", "optimizer"),
    ),
    Stage(
        "dist_optimizer",
        150,
        ("model",),
        ("tokens_per_s", "peak_memory_gb", "planned_memory_gb", "optimizer"),
    ),
    Stage("checkpoint", 180, ("model",), ("params_bit_equal", "optimizer_bit_equal", "save_s", "load_s")),
    Stage(
        "offload",
        150,
        ("model",),
        ("freed_gb", "expected_gb", "allocated_before_gb", "allocated_onloaded_gb"),
    ),
    Stage("collective", 120, ("model",), ("bit_equal", "transfer_gb_per_s", "backend")),
    Stage(
        "delta",
        180,
        ("model",),
        (
            "params",
            "changed_fraction_lr1e-6",
            "identity/shared_fs_wired:bytes_ratio_lr1e-6",
            "identity/shared_fs_wired:seconds_ratio_lr1e-6",
            "tp2_to_tp1/shared_fs_wired:seconds_ratio_lr1e-6",
        ),
    ),
)
BY_NAME = {s.name: s for s in STAGES}
BLOCKED = ("vllm", "ray", "omegaconf", "hydra", "math_verify")
"""Absent on the device (its package list, /work/.library/device/KINDS.md, has none of them)."""
BUDGET_S = 440.0
"""Every stage together, under the 8 minutes the device check is sized for (device_check.sh)."""
MIN_STAGE_S = 20.0
"""A stage that would get less than this of the budget is skipped, not started."""


def block_modules(names: tuple[str, ...]) -> None:
    """Make ``names`` unimportable in this process, as if not installed: ``import`` raises
    ModuleNotFoundError and ``importlib.util.find_spec`` answers None (a None in ``sys.modules``
    does both), so optional-import checks (transformers') see them absent rather than broken."""
    for name in names:
        sys.modules[name] = None  # type: ignore[assignment]


def run_stage_child(name: str, work: Path, device: str, size: str, dtype: str | None, result: Path) -> int:
    """The child process's side: run one stage, write ``{"ok", "figures" | "error"}`` to ``result``."""
    import traceback

    from benchmarks import device_stages

    started = time.perf_counter()
    try:
        ctx = device_stages.context(device=device, size=size, work=work, dtype=dtype)
        figures = device_stages.STAGE_FUNCS[name](ctx)
        record: dict[str, Any] = {"ok": True, "figures": figures}
    except BaseException as err:  # every failure, KeyboardInterrupt aside, is a finding to record
        record = {
            "ok": False,
            "error": f"{type(err).__name__}: {err}",
            "traceback": traceback.format_exc(limit=12),
            "figures": getattr(err, "figures", {}),
        }
    record["seconds"] = time.perf_counter() - started
    result.write_text(json.dumps(record, indent=1, default=str))
    return 0 if record["ok"] else 1


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def stage_command(
    stage: Stage, *, work: Path, device: str, size: str, dtype: str | None, blocked: tuple[str, ...]
) -> list[str]:
    """The child interpreter's command line for ``stage`` (it writes ``result_path``)."""
    cmd = [
        sys.executable, "-m", "benchmarks.device_check", "--stage", stage.name, "--work", str(work),
        "--device", device, "--size", size, "--result", str(result_path(work, stage)),
        "--block", ",".join(blocked),
    ]  # fmt: skip
    return cmd + (["--dtype", dtype] if dtype is not None else [])


def result_path(work: Path, stage: Stage) -> Path:
    return work / f"{stage.name}.result.json"


def log_path(work: Path, stage: Stage) -> Path:
    """The stage process's stdout and stderr."""
    return work / f"{stage.name}.log"


def run_stage(stage: Stage, cmd: list[str], *, timeout_s: float, work: Path, log: Path) -> dict[str, Any]:
    """``cmd`` (``stage_command``'s) in a fresh interpreter, in a session of its own so that a
    timeout kills everything it started; its record, or why there is none."""
    stage_log = log_path(work, stage)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def start() -> int:
        with stage_log.open("w") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        return proc.pid

    return _supervise(stage, start, timeout_s=timeout_s, work=work, log=log)


def run_stage_forked(
    stage: Stage, target: Callable[[], int], *, timeout_s: float, work: Path, log: Path
) -> dict[str, Any]:
    """``target`` (``run_stage_child`` bound to the stage) in a fork of this process, which has
    already imported torch and the engines (``preload``): on CPU a fresh interpreter would spend
    most of a stage importing them again. The child gets a session of its own and the stage's log
    as stdout and stderr, as ``run_stage``'s does; its exit code is ``target``'s."""
    stage_log = log_path(work, stage)

    def start() -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the runner's code
            code = 70
            try:
                os.setsid()
                fd = os.open(stage_log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                # Python's streams anew over those descriptors: the runner's may have been
                # replaced (a test's capture), and buffered text must not be written twice.
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
                code = target()
            except BaseException:  # a crash outside the stage's own handler: the log says why
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        return pid

    return _supervise(stage, start, timeout_s=timeout_s, work=work, log=log)


def _supervise(
    stage: Stage, start: Callable[[], int], *, timeout_s: float, work: Path, log: Path
) -> dict[str, Any]:
    """Start the stage's process (``start`` returns its pid, the leader of a new session), wait
    for it under ``timeout_s``, stop whatever it left, and make its record."""
    result = result_path(work, stage)
    result.unlink(missing_ok=True)
    stage_log = log_path(work, stage)
    started = time.perf_counter()
    pid = start()
    code = _wait(pid, deadline=started + timeout_s)
    if code is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # the stage's own process group, nothing else
        os.waitpid(pid, 0)
    else:
        # What the stage started and left behind goes with it: the stage leaves by os._exit,
        # which runs no exit handlers, so e.g. the multiprocessing Manager that megatron-core
        # 0.19.2's checkpoint writer starts (filesystem_async.get_write_results_queue) would
        # outlive it, orphaned, for good.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    seconds = time.perf_counter() - started
    with log.open("a") as combined:
        combined.write(
            f"===== {stage.name} (exit {code}, {seconds:.1f} s)\n{stage_log.read_text(errors='replace')}\n"
        )
    if code is None:
        return {"ok": False, "seconds": seconds, "figures": {}, "error": f"timed out after {timeout_s:.0f} s",
                "log_tail": _tail(stage_log)}  # fmt: skip
    if not result.exists():
        return {"ok": False, "seconds": seconds, "figures": {}, "error": f"the stage's process died (exit {code})",
                "log_tail": _tail(stage_log)}  # fmt: skip
    record: dict[str, Any] = json.loads(result.read_text())
    record["wall_s"] = seconds  # the process's whole life: interpreter start (or fork) included
    if not record["ok"]:
        record["log_tail"] = _tail(stage_log)
    return record


def _wait(pid: int, *, deadline: float) -> int | None:
    """``pid``'s exit code once it exits, None when ``deadline`` passes first (it is not reaped)."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.perf_counter() >= deadline:
            return None
        time.sleep(0.05)


PRELOADED = ("torch", "transformers", "safetensors.torch", "megatron.core", "benchmarks.device_stages")
"""What the stages import, imported once by a runner that forks them (the ones not blocked and installed)."""


def preload(blocked: tuple[str, ...]) -> list[str]:
    """Import ``PRELOADED`` into this process, after making ``blocked`` unimportable here too (so
    what transformers and the others find absent is what a stage's own interpreter finds); the
    modules imported. Touches no device: forking after a CUDA or NPU runtime started is unsafe."""
    import importlib
    import importlib.util

    block_modules(blocked)
    loaded = []
    for name in PRELOADED:
        if name.split(".")[0] in blocked or importlib.util.find_spec(name.split(".")[0]) is None:
            continue
        importlib.import_module(name)
        loaded.append(name)
    return loaded


def run_all(args: argparse.Namespace, stages: list[Stage]) -> dict[str, Any]:
    """Every stage in order; the report is rewritten after each (``complete`` False until the
    last), so a check cut off from outside still leaves the figures of the stages that ran."""
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    log: Path = args.log or work / "device_check.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    blocked = tuple(b for b in args.block.split(",") if b)
    # The fork runner's imports, once, before the budget starts (a fresh interpreter pays them
    # inside each stage's time instead); not when the budget leaves no stage room to start.
    preloaded, preload_s = None, 0.0
    if args.isolation == "fork" and stages and args.budget_s >= MIN_STAGE_S:
        before = time.perf_counter()
        preloaded = preload(blocked)
        preload_s = time.perf_counter() - before
    started = time.perf_counter()
    deadline = started + args.budget_s
    records: dict[str, dict[str, Any]] = {}
    report: dict[str, Any] = {
        "settings": plan(args, stages), "complete": False, "ok": False, "device": args.device,
        "size": args.size, "wall_s": 0.0, "budget_s": args.budget_s, "blocked_modules": list(blocked),
        "preloaded": preloaded, "preload_s": preload_s, "commit": os.environ.get("DEVICE_CHECK_COMMIT"), "stages": records,
    }  # fmt: skip
    for stage in stages:
        failed_needs = [n for n in stage.needs if n in records and not records[n]["ok"]]
        left = deadline - time.perf_counter()
        if failed_needs:
            why = ", ".join(
                f"{n}, which {'was skipped' if records[n].get('skipped') else 'failed'}" for n in failed_needs
            )
            records[stage.name] = {
                "ok": False,
                "skipped": True,
                "figures": {},
                "error": f"skipped: needs stage {why}",
            }
        elif left < MIN_STAGE_S:
            records[stage.name] = {"ok": False, "skipped": True, "figures": {},
                                   "error": f"skipped: {left:.0f} s of the {args.budget_s:.0f} s budget left"}  # fmt: skip
        else:
            timeout = min(stage.timeout_s * args.timeout_scale, left)
            print(f"[device_check] {stage.name} (timeout {timeout:.0f} s) ...", flush=True)
            if args.isolation == "fork":
                target = functools.partial(
                    run_stage_child,
                    stage.name,
                    work,
                    args.device,
                    args.size,
                    args.dtype,
                    result_path(work, stage),
                )
                records[stage.name] = run_stage_forked(stage, target, timeout_s=timeout, work=work, log=log)
            else:
                cmd = stage_command(
                    stage, work=work, device=args.device, size=args.size, dtype=args.dtype, blocked=blocked
                )
                records[stage.name] = run_stage(stage, cmd, timeout_s=timeout, work=work, log=log)
            records[stage.name]["timeout_s"] = timeout
        _print_line(stage, records[stage.name])
        report["wall_s"] = time.perf_counter() - started
        _save(args.json, report)
    report.update(complete=True, ok=all(r["ok"] for r in records.values()))
    _save(args.json, report)
    return report


def _save(path: Path | None, report: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(report, indent=1, default=str))
    partial.replace(path)  # never a half-written file, even when killed mid-write


def _print_line(stage: Stage, record: dict[str, Any]) -> None:
    status = "ok  " if record["ok"] else ("SKIP" if record.get("skipped") else "FAIL")
    seconds = record.get("wall_s", record.get("seconds"))
    took = f"{seconds:6.1f} s" if isinstance(seconds, (int, float)) else "      -"
    figures = record.get("figures") or {}
    shown = ", ".join(f"{k}={_short(figures[k])}" for k in stage.headline if k in figures)
    error = f"  {record['error']}" if not record["ok"] else ""
    print(f"[device_check] {status} {stage.name:<15} {took}  {shown}{error}"[:400], flush=True)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def plan(args: argparse.Namespace, stages: list[Stage]) -> dict[str, Any]:
    return {
        "device": args.device,
        "size": args.size,
        "dtype": args.dtype or "bfloat16",
        "budget_s": args.budget_s,
        "isolation": args.isolation,
        "blocked_modules": [b for b in args.block.split(",") if b],
        "stages": [
            {"name": s.name, "timeout_s": s.timeout_s * args.timeout_scale, "needs": list(s.needs)}
            for s in stages
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", choices=("full", "tiny"), help="full (0.6 B shape, the GPU) or tiny (CPU)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), help="default bfloat16")
    parser.add_argument("--stages", help=f"comma-separated subset of {', '.join(BY_NAME)} (default: all)")
    parser.add_argument("--json", type=Path, help="write the one JSON here")
    parser.add_argument(
        "--log", type=Path, help="every stage's output, one file (default: WORK/device_check.log)"
    )
    parser.add_argument(
        "--work", type=Path, help="scratch folder: model, checkpoints (default: runs/device_check)"
    )
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="all stages together, seconds")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="multiplies every stage's timeout")
    parser.add_argument("--block", default=",".join(BLOCKED), help="modules made unimportable in every stage")
    parser.add_argument(
        "--isolation",
        choices=("exec", "fork"),
        help="each stage in a fresh interpreter (exec, the default on cuda) or forked from this "
        "process after it imported torch and the engines once (fork, the default on cpu)",
    )
    parser.add_argument("--plan", action="store_true", help="print the stages and settings, run nothing")
    parser.add_argument("--stage", help=argparse.SUPPRESS)  # the child process's side
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.size = args.size or ("full" if args.device == "cuda" else "tiny")
    args.work = args.work or Path("runs/device_check")
    # A device keeps a fresh interpreter per stage: a stage that breaks the CUDA context must not
    # reach the next, and a fork is only safe before any device runtime starts.
    args.isolation = args.isolation or ("exec" if args.device == "cuda" else "fork")
    names = [n for n in (args.stages or ",".join(BY_NAME)).split(",") if n]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown stages {unknown}; choose from {list(BY_NAME)}")
    stages = [BY_NAME[n] for n in names]
    if args.stage is not None:
        block_modules(tuple(b for b in args.block.split(",") if b))
        if args.stage not in BY_NAME or args.result is None:
            parser.error("--stage needs a known stage name and --result")
        code = run_stage_child(args.stage, args.work, args.device, args.size, args.dtype, args.result)
        # The result is written: leave now. An NCCL group or a receiver thread still blocked in a
        # receive can hang the interpreter's shutdown, and the stage's figures are already safe.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if args.plan:
        print(json.dumps(plan(args, stages), indent=1))
        return 0
    report = run_all(args, stages)
    if args.json is not None:
        print(f"[device_check] wrote {args.json}")
    failed = [n for n, r in report["stages"].items() if not r["ok"]]
    print(f"[device_check] {'all stages ok' if not failed else 'failed: ' + ', '.join(failed)} "
          f"in {report['wall_s']:.0f} s")  # fmt: skip
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
