"""examples/ray_launch.sh and the recipe scripts on top of it.

Fast tests: the scripts' shapes and guards (no Ray started). Integration tests: the launcher end to
end on this machine with Ray's token authentication on, each with a fresh HOME (a fresh machine:
no ~/.ray token yet), its own port and Ray temp folder, so that other users' Ray clusters on the
machine are never touched; afterwards no process of that head's is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.models import PolicyModels

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
LAUNCH = EXAMPLES / "ray_launch.sh"
RECIPE_SCRIPTS = sorted([*EXAMPLES.glob("grpo/*.sh"), *EXAMPLES.glob("dapo/*.sh")])
RECIPE_CALL = re.compile(r'recipe_launch\.sh" (\S+) (\S+) (\d+) (\d+) "\$@"')


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _launcher_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A fresh HOME, a port pair of our own and a short Ray temp folder (Ray's socket paths are
    limited to ~107 characters, too short for pytest's tmp_path)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTEST_"))}
    env.update(
        HOME=str(home),
        RAY_PORT=str(_free_port()),
        RAY_HEAD_ARGS=f"--include-dashboard=false --ray-client-server-port={_free_port()} --disable-usage-stats",
        LOG_DIR=str(tmp_path / "logs"),
        PYTHON=sys.executable,
    )
    env.update(extra)
    return env


@pytest.fixture
def ray_temp_dir() -> Iterator[Path]:
    path = Path(f"/tmp/rl_launch_test_{os.getpid()}_{time.monotonic_ns() % 10**6}")
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def _processes_under(marker: str) -> list[str]:
    """Command lines of live processes that name ``marker`` (the head's temp folder: every Ray
    process of that head carries its session folder in its arguments)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def _left_behind(marker: str, grace_s: float = 30.0) -> list[str]:
    """``_processes_under(marker)`` once none is left or ``grace_s`` has passed: a process the
    launcher stopped may take a moment to be gone from /proc. Polls, so it returns as soon as the
    last one has exited (no fixed sleep before the check)."""
    deadline = time.monotonic() + grace_s
    while (found := _processes_under(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


# ---- fast: the scripts ------------------------------------------------------------------------


@pytest.mark.parametrize("script", sorted(EXAMPLES.rglob("*.sh")), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_script_parses_and_never_kills_by_name_or_stops_every_ray(script: Path) -> None:
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    code = "\n".join(line.split("#", 1)[0] for line in script.read_text().splitlines())
    for forbidden in ("pkill", "killall", "ray stop", 'ray" stop', "kill -9"):
        assert forbidden not in code, f"{script}: {forbidden}"


def test_upstream_recipe_scripts_exist_with_upstreams_names() -> None:
    names = {p.relative_to(EXAMPLES).as_posix() for p in RECIPE_SCRIPTS}
    assert {
        "grpo/grpo_trainer_qwen25_7b.sh", "grpo/grpo_trainer_qwen25_32b.sh", "grpo/grpo_trainer_qwen3_8b.sh",
        "grpo/grpo_trainer_qwen3_235b_a22b.sh", "dapo/dapo_trainer_qwen25_32b.sh",
        "dapo/dapo_trainer_qwen3_30b_a3b.sh", "dapo/dapo_trainer_qwen3_32b.sh",
    } <= names  # fmt: skip


@pytest.mark.parametrize("script", RECIPE_SCRIPTS, ids=lambda p: p.name)
def test_recipe_script_runs_its_entry_on_a_cluster_of_its_configs_size(script: Path) -> None:
    match = RECIPE_CALL.search(script.read_text())
    assert match, f"{script} does not call recipe_launch.sh"
    entry, default_yaml, nodes, per_node = match.groups()
    kind = script.parent.name  # grpo / dapo
    assert entry == f"cli/train_{kind}.py" and (ROOT / entry).is_file()
    config = yaml.safe_load((ROOT / "configs" / f"{default_yaml}.yaml").read_text())
    assert config["megatron_training"]["stage"] == f"ray_{kind}"
    assert config["rl_config"]["actor_resource"]["num_npus"] == int(nodes) * int(per_node)


@pytest.fixture
def stub_examples(tmp_path: Path) -> Path:
    """recipe_launch.sh and one recipe script beside a ray_launch.sh that prints what it got."""
    folder = tmp_path / "examples"
    (folder / "grpo").mkdir(parents=True)
    (folder / "recipe_launch.sh").write_text((EXAMPLES / "recipe_launch.sh").read_text())
    script = EXAMPLES / "grpo" / "grpo_trainer_qwen3_8b.sh"
    (folder / "grpo" / script.name).write_text(script.read_text())
    (folder / "ray_launch.sh").write_text(
        'echo "NNODES=$NNODES NPUS_PER_NODE=$NPUS_PER_NODE TRAIN_ENTRY=${TRAIN_ENTRY:-} '
        'CONFIG_DIR=${CONFIG_DIR:-} ARGS=$*"\n'
    )
    return folder / "grpo" / script.name


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "NNODES=1 NPUS_PER_NODE=16 TRAIN_ENTRY=cli/train_grpo.py CONFIG_DIR= ARGS=grpo_qwen3_8b_A3"),
        (["my_recipe.yaml", "a.b=1"], "CONFIG_DIR= ARGS=my_recipe a.b=1"),
        (["a.b=1"], "CONFIG_DIR= ARGS=grpo_qwen3_8b_A3 a.b=1"),
        (["--worker"], "NPUS_PER_NODE=16 TRAIN_ENTRY= CONFIG_DIR= ARGS=--worker"),
    ],
)
def test_recipe_script_call_shape(stub_examples: Path, args: list[str], expected: str) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NNODES", "NPUS_PER_NODE", "TRAIN_ENTRY", "CONFIG_DIR")
    }
    out = subprocess.run(
        ["bash", str(stub_examples), *args], capture_output=True, text=True, env=env, check=True
    )
    assert expected in out.stdout, out.stdout


def test_recipe_script_takes_a_yaml_path_as_its_config_dir(stub_examples: Path, tmp_path: Path) -> None:
    own = tmp_path / "mine" / "grpo_qwen3_8b_A3.yaml"
    own.parent.mkdir()
    own.write_text("{}\n")
    env = {**os.environ, "NNODES": "2"}
    out = subprocess.run(
        ["bash", str(stub_examples), str(own)], capture_output=True, text=True, env=env, check=True
    )
    assert (
        f"NNODES=2 NPUS_PER_NODE=16 TRAIN_ENTRY=cli/train_grpo.py CONFIG_DIR={own.parent} ARGS=grpo_qwen3_8b_A3"
        in (out.stdout)
    )


# ---- fast: the launcher's guards (no Ray process is started) -----------------------------------


def test_launcher_refuses_to_turn_token_authentication_off(tmp_path: Path) -> None:
    env = _launcher_env(tmp_path, RAY_AUTH_MODE="disabled")
    proc = subprocess.run(["bash", str(LAUNCH), "grpo_tiny_asp"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "keeps Ray's token authentication on" in proc.stderr


def test_a_worker_without_the_heads_token_stops_with_the_fix(tmp_path: Path) -> None:
    env = _launcher_env(tmp_path, RAY_HEAD="127.0.0.1:1")
    proc = subprocess.run(["bash", str(LAUNCH), "--worker"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Copy the head node's token file" in proc.stderr
    assert not (tmp_path / "home" / ".ray" / "auth_token").exists()  # a worker never makes its own


def test_launcher_never_starts_on_a_port_another_cluster_holds(tmp_path: Path, ray_temp_dir: Path) -> None:
    with socket.socket() as other:  # someone else's service on the port
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = _launcher_env(tmp_path, RAY_PORT=str(port), RAY_TEMP_DIR=str(ray_temp_dir))
        proc = subprocess.run(["bash", str(LAUNCH), "grpo_tiny_asp"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and f"port {port} is in use" in proc.stderr
    assert not _left_behind(str(ray_temp_dir))


# ---- integration: the launcher end to end -----------------------------------------------------

# The command made short: 4 iterations of 4 prompts x 4 samples on the HF engine (no vLLM
# start-up; with 8 prompts the demo's noisy-oracle length predictor misses its target rank correlation).
TINY_RUN = (
    "megatron_training.train_iters=4",
    "megatron_training.global_batch_size=4",
    "rl_config.mini_batch_size=4",
    "rl_config.n_samples_per_prompt=4",
    "actor_config.micro_batch_size=16",
    "rl_config.actor_forward_micro_batch_size=16",
    "rl_config.ref_forward_micro_batch_size=16",
    "rl_config.rollout_backend=hf",
    "rl_config.use_tensorboard=false",
    "warmup_config.steps=5",
    "asp_config.b=2",
    "asp_config.kappa=0",
    "asp_config.k=2",
    "asp_config.sa_iterations=1000",
    "async_config.queue_max_samples=24",
    "async_config.queue_resume_samples=12",
    "async_config.gu_queue_low=1",
    "async_config.gu_queue_high=2",
    "generate_config.sampling_config.max_tokens=24",
)


PROBE = r'''
"""Driver probe run by the launcher before the trainer: three clients try the cluster."""
import json, os, subprocess, sys

address = os.environ["RAY_ADDRESS"]
connect = (
    "import ray, sys\n"
    "ray.init(address=sys.argv[1])\n"
    "print('NODES', len(ray.nodes()))\n"
)
join = (
    "import sys\n"
    "from mindspeed_rl.utils.ray_setup import join_cluster\n"
    "try:\n"
    "    join_cluster(sys.argv[1], found_locally=False)\n"
    "except ConnectionError as err:\n"
    "    print('REFUSED', err)\n"
    "    sys.exit(3)\n"
)
bare = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
bare["HOME"] = sys.argv[2]  # another user: no token file
# Ray retries a refused connection for ~20 s by default; 3 tries keep the refusal, in ~3 s.
bare["RAY_NUM_REDIS_GET_RETRIES"] = "3"
wrong = {**bare, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}
results = {}
for name, env, code in (("no_token", bare, join), ("wrong_token", wrong, connect), ("cluster_token", None, connect)):
    proc = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True, env=env, timeout=300)
    results[name] = {"rc": proc.returncode, "out": proc.stdout[-3000:] + proc.stderr[-3000:]}
with open(sys.argv[1], "w") as handle:
    json.dump(results, handle)
'''


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchedRun:
    proc: subprocess.CompletedProcess[str]
    env: dict[str, str]
    home: Path
    runs: Path
    ray_temp_dir: Path
    probe: dict[str, Any]
    leftover: list[str]
    """Processes of the head's temp folder alive after the launcher exited."""
    port_listening: bool


@pytest.fixture(scope="module")
def launched_run(
    tmp_path_factory: pytest.TempPathFactory, policy_models: PolicyModels
) -> Iterator[LaunchedRun]:
    """One launcher invocation read by two tests: the head comes up with token authentication, the
    entry first runs the token probe (``PROBE``: clients without / with a wrong / with the token)
    against it, then becomes the real trainer (``exec cli/train_grpo.py`` with the launcher's
    arguments), which runs the tiny async run on it; then the launcher stops its head."""
    tmp_path = tmp_path_factory.mktemp("launcher")
    ray_temp_dir = Path(f"/tmp/rl_launch_test_{os.getpid()}_{time.monotonic_ns() % 10**6}")
    probe, results, other_home = tmp_path / "probe.py", tmp_path / "results.json", tmp_path / "other_home"
    probe.write_text(PROBE)
    other_home.mkdir()
    entry = tmp_path / "entry.py"
    entry.write_text(
        "import os, subprocess, sys\n"
        f"subprocess.run([sys.executable, {str(probe)!r}, {str(results)!r}, {str(other_home)!r}], check=True)\n"
        f"os.execv(sys.executable, [sys.executable, {str(ROOT / 'cli' / 'train_grpo.py')!r}, *sys.argv[1:]])\n"
    )
    env = _launcher_env(tmp_path, NNODES="1", RAY_TEMP_DIR=str(ray_temp_dir), TRAIN_ENTRY=str(entry))
    model = tmp_path / "model"
    overrides = [
        *TINY_RUN,
        f"run_dir={tmp_path / 'runs'}",
        f"megatron_training.tokenizer_name_or_path={model}",
    ]
    policy_models.provide(model, "grpo_tiny_asp", overrides)
    try:
        proc = subprocess.run(
            ["bash", str(LAUNCH), "grpo_tiny_asp", *overrides],
            capture_output=True,
            text=True,
            env=env,
            timeout=1500,
        )
        yield LaunchedRun(
            proc=proc, env=env, home=tmp_path / "home", runs=tmp_path / "runs", ray_temp_dir=ray_temp_dir,
            probe=json.loads(results.read_text()) if results.is_file() else {},
            leftover=_left_behind(str(ray_temp_dir)), port_listening=_listening(int(env["RAY_PORT"])),
        )  # fmt: skip
    finally:
        subprocess.run(["rm", "-rf", str(ray_temp_dir)], check=False)


@pytest.mark.integration
@pytest.mark.slow
def test_launcher_runs_a_tiny_run_with_token_auth_and_leaves_no_ray_process(
    launched_run: LaunchedRun,
) -> None:
    proc = launched_run.proc
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    token = launched_run.home / ".ray" / "auth_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) == 64
    assert "with token authentication" in out and "ray joined" in out
    (run_dir,) = launched_run.runs.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train_steps"] == 4 and summary["prompts_consumed_total"] == 16
    assert "stopping the Ray head this script started" in out
    assert not launched_run.leftover, "the launcher left Ray processes behind"
    assert not launched_run.port_listening


@pytest.mark.integration
@pytest.mark.slow
def test_a_client_without_the_clusters_token_is_refused(launched_run: LaunchedRun) -> None:
    assert launched_run.proc.returncode == 0, (launched_run.proc.stdout + launched_run.proc.stderr)[-6000:]
    got = launched_run.probe
    assert got["cluster_token"]["rc"] == 0 and "NODES 1" in got["cluster_token"]["out"], got["cluster_token"]
    for name in ("no_token", "wrong_token"):
        assert got[name]["rc"] != 0, (name, got[name])
        assert "InvalidAuthToken" in got[name]["out"], (name, got[name]["out"])
    assert "REFUSED could not join the Ray cluster" in got["no_token"]["out"]
    assert "RAY_AUTH_TOKEN_PATH=<a copy of the head's token file>" in got["no_token"]["out"]
    assert not launched_run.leftover, "the launcher left Ray processes behind"


SLEEPER = """
import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("up")
time.sleep(600)
"""


@pytest.mark.integration
@pytest.mark.slow
def test_a_sigterm_to_the_launcher_stops_its_driver_and_its_head(tmp_path: Path, ray_temp_dir: Path) -> None:
    ready = tmp_path / "driver_up"
    wrapper = tmp_path / "entry.py"
    wrapper.write_text(f"import sys\nsys.argv = ['sleeper', {str(ready)!r}]\n" + SLEEPER)
    env = _launcher_env(tmp_path, NNODES="1", RAY_TEMP_DIR=str(ray_temp_dir), TRAIN_ENTRY=str(wrapper))
    launcher = subprocess.Popen(
        ["bash", str(LAUNCH), "grpo_tiny_asp"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 600
        while not ready.exists():
            assert launcher.poll() is None and time.monotonic() < deadline, "the driver never started"
            time.sleep(1)
        assert _processes_under(str(ray_temp_dir)), "no head running while the driver runs"
        launcher.send_signal(signal.SIGTERM)
        out, _ = launcher.communicate(timeout=180)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 143, out[-3000:]
    assert "stopping the driver" in out and "stopping the Ray head this script started" in out
    assert not _left_behind(str(wrapper)), "the driver outlived the launcher"
    assert not _left_behind(str(ray_temp_dir)), "the launcher left Ray processes behind"


NODE_COUNTER = """
import os, ray
ray.init(address=os.environ["RAY_ADDRESS"])
print("DRIVER_SEES_NODES", sum(1 for n in ray.nodes() if n["Alive"]))
"""


@pytest.mark.integration
@pytest.mark.slow
def test_a_worker_joins_with_the_heads_token_and_the_head_waits_for_it(
    tmp_path: Path, ray_temp_dir: Path
) -> None:
    # Both on this machine and one HOME: the worker reads the head's token file, as a copy would be.
    entry = tmp_path / "entry.py"
    entry.write_text(NODE_COUNTER)
    env = _launcher_env(tmp_path, NNODES="2", RAY_TEMP_DIR=str(ray_temp_dir), TRAIN_ENTRY=str(entry))
    head = subprocess.Popen(
        ["bash", str(LAUNCH), "grpo_tiny_asp"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    worker: subprocess.Popen[str] | None = None
    try:
        assert head.stdout is not None
        lines = []
        for line in head.stdout:  # the head prints the join command once it is up
            lines.append(line)
            if "RAY_HEAD=" in line:
                break
        address = re.search(r"RAY_HEAD=(\S+)", lines[-1])
        assert address, "".join(lines)[-3000:]
        worker_env = {**env, "RAY_HEAD": address.group(1), "RAY_WORKER_ARGS": "--disable-usage-stats"}
        worker = subprocess.Popen(
            ["bash", str(LAUNCH), "--worker"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=worker_env,
        )
        rest, _ = head.communicate(timeout=600)
    finally:
        for proc in (head, worker):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the worker's `ray start --block` stops its own node
                proc.wait(timeout=120)
    out = "".join(lines) + rest
    assert head.returncode == 0, out[-4000:]
    assert "2 node(s) alive" in out and "DRIVER_SEES_NODES 2" in out
    assert not _left_behind(str(ray_temp_dir)), "the head left Ray processes behind"
    assert not _left_behind(address.group(1)), "the worker left Ray processes behind"
