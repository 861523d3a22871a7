"""``benchmarks/device_check.sh`` and its stages (``benchmarks/device_check.py``).

The device itself is not here: the shell script's dry run is checked for the exact commands it
would run there, its refusals for their messages, the runner for stage independence (a stage that
hangs or dies is recorded and the next one runs), and every stage runs for real on CPU at tiny
sizes, with ``vllm`` and ``ray`` (installed on this host) made unimportable as on the device.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import device_check
from tests.support.cli_runs import survivors

REPO = Path(__file__).resolve().parents[4]
SCRIPT = REPO / "benchmarks" / "device_check.sh"
HAVE_MEGATRON = importlib.util.find_spec("megatron") is not None


def _script(*args: str, tmp_path: Path, wheels: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "DEVICE_CHECK_WORK": str(tmp_path / "work")}  # fmt: skip
    if wheels is not None:
        env["DEVICE_CHECK_WHEELS"] = str(wheels)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def _pin_version() -> str:
    import runpy

    pin = runpy.run_path(str(REPO / "mindspeed_rl" / "_pins.py"))["EXTRAS"]["megatron"][0]
    return str(pin).removeprefix("megatron-core==")


def _fake_wheel(folder: Path, nbytes: int = 1000, tag: str = "manylinux_2_28_x86_64") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"megatron_core-{_pin_version()}-cp312-cp312-{tag}.whl"
    with wheel.open("wb") as f:
        f.truncate(nbytes)
    return wheel


def test_dry_run_prints_the_device_commands_and_runs_none(tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path / "wheels")
    done = _script(
        "--dry-run", "--", "--stages", "env,offload", tmp_path=tmp_path, wheels=tmp_path / "wheels"
    )
    assert done.returncode == 0, done.stderr
    commands = [line for line in done.stdout.splitlines() if line.startswith("+ ")]
    site = f"{REPO}/.cache/device_site"
    install = f"-m pip install --no-deps --no-index --no-compile --no-cache-dir --quiet --target .cache/device_site {wheel}"
    assert any(install in c for c in commands), commands
    run = next(c for c in commands if "-m benchmarks.device_check" in c)
    assert f"env PYTHONPATH={site}:{REPO} " in run
    assert "timeout --kill-after=15 465 " in run  # with the install, under 8 minutes
    out = tmp_path / "out"
    assert f"--device cuda --budget-s 440 --work {tmp_path / 'work'} --json {out}/device_check.json" in run
    assert run.endswith("--stages env\\,offload")  # the arguments after -- reach device_check.py
    assert "torch.cuda.is_available()" in commands[0]  # the Python 3.12 + CUDA check comes first
    assert "dry run:" in done.stdout
    # Nothing ran: no install, no output folder, no scratch folder.
    assert not out.exists() and not (tmp_path / "work").exists()


def test_dry_run_without_the_wheel_says_how_to_get_it(tmp_path: Path) -> None:
    done = _script("--dry-run", tmp_path=tmp_path, wheels=tmp_path / "none")
    assert done.returncode == 0, done.stderr
    assert "--prepare" in done.stdout and f"megatron_core-{_pin_version()}-cp312-" in done.stdout


def test_the_device_run_refuses_without_the_wheel(tmp_path: Path) -> None:
    done = _script(tmp_path=tmp_path, wheels=tmp_path / "none")
    assert done.returncode == 1
    assert "no wheel matches" in done.stderr and "--prepare" in done.stderr and "carry" in done.stderr
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_a_wheel_too_large_to_carry_is_refused(tmp_path: Path) -> None:
    _fake_wheel(tmp_path / "wheels", nbytes=17 * 1024 * 1024)
    done = _script("--dry-run", tmp_path=tmp_path, wheels=tmp_path / "wheels")
    assert done.returncode == 1 and "bytes, over" in done.stderr


def test_two_wheels_are_refused(tmp_path: Path) -> None:
    _fake_wheel(tmp_path / "wheels")
    _fake_wheel(tmp_path / "wheels", tag="manylinux_2_17_x86_64")
    done = _script("--dry-run", tmp_path=tmp_path, wheels=tmp_path / "wheels")
    assert done.returncode == 1 and "several wheels" in done.stderr


def test_unknown_arguments_are_refused(tmp_path: Path) -> None:
    done = _script("--bogus", tmp_path=tmp_path)
    assert done.returncode == 2 and "unknown argument '--bogus'" in done.stderr


def test_the_dry_run_checks_the_runner_accepts_its_arguments(tmp_path: Path) -> None:
    done = _script("--dry-run", "--", "--stages", "nonsense", tmp_path=tmp_path, wheels=tmp_path / "none")
    assert done.returncode == 1
    assert "unknown stages ['nonsense']" in done.stderr and "refused the arguments" in done.stderr


def test_blocked_modules_look_uninstalled() -> None:
    """What every stage process does first: ``import`` fails and ``find_spec`` says absent."""
    code = (
        "import importlib.util, sys\n"
        "from benchmarks.device_check import block_modules\n"
        "block_modules(('json',))\n"
        "assert importlib.util.find_spec('json') is None\n"
        "try:\n    import json\nexcept ModuleNotFoundError:\n    print('blocked')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "blocked", done.stderr


def _stage(name: str = "probe") -> device_check.Stage:
    return device_check.Stage(name, 5)


def test_a_stage_past_its_timeout_is_killed_and_recorded(tmp_path: Path) -> None:
    # The stage prints its pid, then would write ``woke`` after its sleep: killed at the timeout,
    # it never does and is gone when run_stage returns (no wall-clock bound: waiting the sleep
    # out would leave the marker, a stage left running would be a survivor).
    woke = tmp_path / "woke"
    code = f"import os, time; print('started', os.getpid(), flush=True); time.sleep(120); open({str(woke)!r}, 'w')"
    log = tmp_path / "all.log"
    record = device_check.run_stage(
        _stage(), [sys.executable, "-c", code], timeout_s=2, work=tmp_path, log=log
    )
    assert record["ok"] is False and record["error"] == "timed out after 2 s"
    assert "started" in record["log_tail"] and "===== probe (exit None" in log.read_text()
    pid = int(record["log_tail"].split("started", 1)[1].split()[0])
    assert survivors({pid}, grace_s=10) == [] and not woke.exists()


def test_what_a_finished_stage_left_running_is_stopped(tmp_path: Path) -> None:
    # The stage starts a child that would write ``woke`` later, then leaves by os._exit as every
    # stage does: the child (like megatron's checkpoint-writer Manager) must not outlive it.
    woke = tmp_path / "woke"
    child = f"import time; time.sleep(60); open({str(woke)!r}, 'w')"
    code = (
        "import os, subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
        "print('child', p.pid, flush=True); os._exit(0)"
    )
    record = device_check.run_stage(
        _stage(), [sys.executable, "-c", code], timeout_s=30, work=tmp_path, log=tmp_path / "all.log"
    )
    pid = int((tmp_path / "probe.log").read_text().split("child", 1)[1].split()[0])
    assert record["error"] == "the stage's process died (exit 0)"  # no result file: not a real stage
    assert survivors({pid}, grace_s=10) == [] and not woke.exists()


def test_a_stage_that_dies_without_a_result_is_recorded(tmp_path: Path) -> None:
    record = device_check.run_stage(
        _stage(), [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
        timeout_s=30, work=tmp_path, log=tmp_path / "all.log",
    )  # fmt: skip
    assert record["ok"] is False and record["error"] == "the stage's process died (exit 3)"
    assert "boom" in record["log_tail"]


def _sleep_then_mark(woke: Path) -> int:
    print("started", os.getpid(), flush=True)
    time.sleep(120)
    woke.write_text("woke")
    return 0


def test_a_forked_stage_past_its_timeout_is_killed_and_recorded(tmp_path: Path) -> None:
    """The CPU runner's way (``--isolation fork``): the same record and the same kill."""
    woke = tmp_path / "woke"
    log = tmp_path / "all.log"
    record = device_check.run_stage_forked(
        _stage(), functools.partial(_sleep_then_mark, woke), timeout_s=2, work=tmp_path, log=log
    )
    assert record["ok"] is False and record["error"] == "timed out after 2 s"
    assert "started" in record["log_tail"] and "===== probe (exit None" in log.read_text()
    pid = int(record["log_tail"].split("started", 1)[1].split()[0])
    assert pid != os.getpid() and survivors({pid}, grace_s=10) == [] and not woke.exists()


def _die(code: int) -> int:
    print("boom", flush=True)
    os._exit(code)


def test_a_forked_stage_that_dies_without_a_result_is_recorded(tmp_path: Path) -> None:
    record = device_check.run_stage_forked(
        _stage(), functools.partial(_die, 3), timeout_s=30, work=tmp_path, log=tmp_path / "all.log"
    )
    assert record["ok"] is False and record["error"] == "the stage's process died (exit 3)"
    assert "boom" in record["log_tail"]


def test_the_isolation_is_a_fresh_interpreter_on_the_device_and_a_fork_on_cpu() -> None:
    def isolation(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.device_check", "--plan", *args],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return str(json.loads(done.stdout)["isolation"])

    assert isolation("--device", "cuda") == "exec" and isolation("--device", "cpu") == "fork"
    assert isolation("--device", "cpu", "--isolation", "exec") == "exec"


def _run_check(tmp_path: Path, *args: str, timeout: int) -> dict[str, Any]:
    out = tmp_path / "check.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.device_check", "--device", "cpu", "--work", str(tmp_path / "work"),
         "--json", str(out), *args],
        cwd=REPO, timeout=timeout, capture_output=True, text=True,
    )  # fmt: skip
    report: dict[str, Any] = json.loads(out.read_text())
    return report


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core not installed (make setup installs it)")
def test_every_stage_runs_on_cpu_with_vllm_and_ray_blocked(tmp_path: Path) -> None:
    """The device's code path at tiny sizes: gloo for NCCL, the engine's CPU optimizer for megatron's."""
    report = _run_check(tmp_path, timeout=590)
    stages = report["stages"]
    failed = {n: (r.get("error"), r.get("log_tail", "")[-1500:]) for n, r in stages.items() if not r["ok"]}
    assert not failed, failed
    assert list(stages) == [s.name for s in device_check.STAGES]
    # Forked from a runner that imported the stacks once, with the same modules blocked first.
    assert report["settings"]["isolation"] == "fork" and {"torch", "megatron.core"} <= set(
        report["preloaded"]
    )
    assert {"vllm", "ray"} <= set(report["blocked_modules"]) <= set(stages["env"]["figures"]["blocked"])
    for name in ("smoke_torch", "smoke_megatron"):
        smoke = stages[name]["figures"]
        assert (
            smoke["tokens_per_s"] > 0 and smoke["planned_memory_gb"] > 0 and smoke["peak_memory_gb"] is None
        )
    dist = stages["dist_optimizer"]["figures"]
    assert report["settings"]["dtype"] == "bfloat16"  # so fp32 gradients are the switch's doing
    assert dist["grad_buffer_dtypes"] == dist["main_grad_dtypes"] == ["torch.float32"]
    ckpt = stages["checkpoint"]["figures"]
    assert ckpt["params_differed_before_load"] and ckpt["params_bit_equal"] and ckpt["optimizer_bit_equal"]
    # bf16 on CPU: the engine's fp32 masters and both Adam moments of every parameter, all restored.
    assert ckpt["optimizer"] == "MasterWeightOptimizer" and ckpt["optimizer_tensors"] == 3 * ckpt["params"]
    assert ckpt["next_step_max_abs_diff"] == 0.0  # CPU kernels are deterministic
    offload = stages["offload"]["figures"]
    assert offload["grad_buffer_bytes_before"] > 0 and offload["grad_buffer_bytes_offloaded"] == 0
    assert offload["params_restored_bit_equal"] and offload["optimizer_restored_bit_equal"]
    assert offload["next_step_max_abs_diff"] == 0.0
    collective = stages["collective"]["figures"]
    assert collective["backend"] == "gloo" and collective["bit_equal"] and collective["buckets"] > 1
    assert collective["bytes_received"] == collective["bytes"]
    delta = stages["delta"]["figures"]  # every refresh was checked bit for bit inside the stage
    for lr in ("lr=1e-06", "lr=1e-05"):
        case = delta["cases"][lr]
        assert case["dtype"] == "torch.bfloat16" and len(case["changed_fraction"]) == delta["steps_per_lr"]
        assert all(0 < f < 1 for f in case["changed_fraction"])
        for key in ("identity/memory", "identity/shared_fs_wired", "tp2_to_tp1/shared_fs_wired"):
            assert 0 < case[key]["bytes_ratio"] < 1, (lr, key)
    # A tenfold learning rate changes more of the bf16 words, so its delta carries more bytes.
    low, high = (statistics.median(delta["cases"][lr]["changed_fraction"]) for lr in ("lr=1e-06", "lr=1e-05"))
    assert high > low


@pytest.mark.integration
@pytest.mark.timeout(400)
@pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core not installed (make setup installs it)")
def test_a_failing_stage_leaves_the_others_running(tmp_path: Path) -> None:
    """megatron made unimportable: its stage fails with the import error, the ones after it run.
    Each stage in a fresh interpreter, as on the device (the full check above forks them)."""
    report = _run_check(
        tmp_path, "--stages", "model,smoke_megatron,collective", "--block", "vllm,ray,megatron",
        "--isolation", "exec", timeout=390,
    )  # fmt: skip
    assert report["settings"]["isolation"] == "exec"
    stages = report["stages"]
    assert report["ok"] is False
    assert stages["model"]["ok"] and stages["collective"]["ok"], stages
    assert not stages["smoke_megatron"]["ok"]
    assert "needs megatron-core" in stages["smoke_megatron"]["error"]  # the engine's own message


def test_stages_past_the_budget_are_skipped_not_started(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.device_check", "--device", "cpu", "--budget-s", "5",
         "--work", str(tmp_path / "work"), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    report = json.loads(out.read_text())
    assert report["complete"] is True and report["ok"] is False
    assert list(report["stages"]) == [s.name for s in device_check.STAGES]
    for name, record in report["stages"].items():
        assert record["skipped"], name
        if name in ("env", "model"):
            assert re.fullmatch(r"skipped: \d+ s of the 5 s budget left", record["error"]), record
        else:  # the stages that load the model say why they did not start
            assert record["error"] == "skipped: needs stage model, which was skipped"
    assert not list((tmp_path / "work").glob("*.result.json"))  # no stage process was started
