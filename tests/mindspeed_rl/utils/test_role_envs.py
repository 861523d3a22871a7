"""``async_config.role_envs``: the plan's record, the actors' runtime_env, what each role must
provide, the start-up check's comparisons, the live check, and the light driver and Control Unit.
No Ray here (the two-environment run is ``trainer/test_role_envs_e2e.py``)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.trainer.role_processes import check_live, plan_modules
from mindspeed_rl.utils.env_probe import ENGINE_MODULES, EnvReport, module_version
from mindspeed_rl.utils.role_env_check import RoleEnvError, expand_env_vars, problems_of
from mindspeed_rl.utils.role_envs import (
    HYBRID_REFUSAL,
    RoleEnv,
    RoleEnvs,
    missing_in_one_process,
    one_process_refusal,
    required_modules,
    role_options,
)

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"


def _plan(name: str, *overrides: str) -> Any:
    return build_run_plan(load_config_from_files(CONFIGS, name, list(overrides)))


def _report(**changes: Any) -> EnvReport:
    base = EnvReport(
        executable="/envs/x/bin/python", prefix="/envs/x", python_version="3.11.7", ray_version="2.60.0",
        snapshot_format=1, project_path="/src", packages={"torch": "2.13.0"},
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


ENVS = RoleEnvs(
    trainer=RoleEnv(role="trainer", python="/envs/trainer/bin/python"),
    rollout=RoleEnv(role="rollout", python="/envs/rollout/bin/python"),
)


def test_the_plan_carries_role_envs_and_leaves_them_out_by_default() -> None:
    assert _plan("grpo_tiny_asp").async_spec.role_envs is None
    plan = _plan(
        "grpo_tiny_asp",
        "++async_config.role_envs.trainer.python=/envs/trainer/bin/python",
        "++async_config.role_envs.rollout.env_vars.PYTHONPATH=/src",
    )
    envs = plan.async_spec.role_envs
    assert envs.trainer == RoleEnv(role="trainer", python="/envs/trainer/bin/python")
    assert envs.rollout.python is None and dict(envs.rollout.env_vars) == {"PYTHONPATH": "/src"}
    assert envs.summary() == {
        "trainer": "/envs/trainer/bin/python",
        "rollout": "the environment Ray was started from",
    }


def test_an_empty_interpreter_path_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"async_config\.role_envs\.rollout\.python is empty"):
        _plan("grpo_tiny_asp", "++async_config.role_envs.rollout.python=' '")


def test_the_hybrid_pipeline_refuses_role_envs_with_the_reason() -> None:
    with pytest.raises(ValueError) as err:
        _plan("grpo_tiny_cpu", "++async_config.role_envs.trainer.python=/envs/trainer/bin/python")
    assert str(err.value) == HYBRID_REFUSAL
    assert "one process has one Python environment" in HYBRID_REFUSAL and "pipeline: async" in HYBRID_REFUSAL


def test_an_actors_runtime_env_is_the_jobs_with_the_roles_interpreter_and_variables() -> None:
    job = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "A": "job"}, "worker_process_setup_hook": "m.hook"}
    env = RoleEnv(role="rollout", python="/envs/rollout/bin/python", env_vars={"A": "role", "B": "x"})
    assert env.runtime_env(job) == {
        "env_vars": {"TOKENIZERS_PARALLELISM": "false", "A": "role", "B": "x"},
        "worker_process_setup_hook": "m.hook",
        "py_executable": "/envs/rollout/bin/python",
    }
    assert job["env_vars"] == {"TOKENIZERS_PARALLELISM": "false", "A": "job"}  # not mutated
    assert role_options(None, {"num_cpus": 1}) == {"num_cpus": 1}
    assert role_options({"py_executable": "p"}, {"num_cpus": 1}) == {
        "num_cpus": 1,
        "runtime_env": {"py_executable": "p"},
    }


def test_each_role_is_asked_for_its_own_stack() -> None:
    assert "megatron.core" not in required_modules(
        "trainer", megatron=False, rollout_backend="vllm", device_kind=None
    )
    npu_trainer = required_modules("trainer", megatron=True, rollout_backend="vllm", device_kind="NPU")
    assert {"megatron.core", "torch_npu", "mindspeed"} <= set(npu_trainer) and "vllm" not in npu_trainer
    npu_rollout = required_modules("rollout", megatron=True, rollout_backend="vllm", device_kind="NPU")
    assert {"vllm", "vllm_ascend", "torch_npu"} <= set(npu_rollout) and "megatron.core" not in npu_rollout
    assert "vllm" not in required_modules("rollout", megatron=False, rollout_backend="hf", device_kind="GPU")
    modules = plan_modules(_plan("grpo_tiny_megatron"))
    assert "megatron.core" in modules["trainer"] and "vllm" in modules["rollout"]


def test_env_vars_expand_as_rays_workers_expand_them() -> None:
    assert expand_env_vars({"P": "/a:${PYTHONPATH}", "Q": "${NOPE}x"}, {"PYTHONPATH": "/b"}) == {
        "P": "/a:/b",
        "Q": "x",
    }


def test_the_start_up_comparisons_name_both_sides() -> None:
    base = _report(executable="/usr/bin/python3")
    reports = {
        "trainer": _report(snapshot_format=2, packages={"torch": "2.7.1", "megatron.core": None}),
        "rollout": _report(python_version="3.10.14", ray_version="2.48.0", packages={"torch": "2.8.0"}),
    }
    problems = problems_of(reports, ENVS, base, one_torch_transport="collective")
    text = "\n".join(problems)
    assert "the trainer environment (/envs/trainer/bin/python) lacks megatron.core" in text
    assert "runs Python 3.10.14, the driver and Ray 3.11.7" in text
    assert "has ray 2.48.0, the cluster ray 2.60.0" in text
    assert "writes snapshot format 2" in text and "reads snapshot format 1" in text
    assert "torch 2.7.1, the rollout environment torch 2.8.0" in text
    # The same two torch versions are no problem over snapshot files or byte buffers.
    assert not any(
        "torch.distributed" in p for p in problems_of(reports, ENVS, base, one_torch_transport=None)
    )
    # A fake cluster's dry run reports missing modules without refusing them.
    lenient = problems_of(reports, ENVS, base, one_torch_transport=None, require_modules=False)
    assert not any("lacks" in p for p in lenient)


def test_the_live_check_refuses_a_generation_unit_of_another_format() -> None:
    same = {"trainer_ranks": [_report().to_json()], "generation_units": [_report().to_json()] * 2}
    check_live(same, ENVS)
    other = {
        **same,
        "generation_units": [_report().to_json(), _report(snapshot_format=3, project_path="/old").to_json()],
    }
    with pytest.raises(RoleEnvError, match=r"writes snapshot format 1.*/old\) reads snapshot format 3"):
        check_live(other, ENVS)


def test_module_versions_are_found_without_importing() -> None:
    assert module_version("ray") and module_version("no_such_module_here") is None
    assert module_version("no_such_package.core") is None and module_version("megatron.no_such_part") is None
    assert module_version("megatron.core")  # megatron-core is in this .venv
    code = (
        "import sys; from mindspeed_rl.utils.env_probe import module_version; "
        "module_version('vllm'); module_version('megatron.core'); "
        "print(sorted(m for m in ('vllm', 'torch', 'megatron') if m in sys.modules))"
    )  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_module_versions_match_the_scan_of_every_distribution() -> None:
    """The quick path (the distribution named like the module, or in DIST_NAMES, checked against
    its own file list) answers what the full scan answers, for modules whose distribution is named
    like them or differently (yaml: PyYAML; zmq: pyzmq; PIL: pillow); the modules every run
    process reports never start the full scan."""
    import importlib.metadata

    from mindspeed_rl.trainer.role_processes import REPORTED_MODULES

    scan = importlib.metadata.packages_distributions()
    for module in ("torch", "vllm", "megatron.core", "yaml", "google.protobuf", "safetensors", "zmq", "PIL"):
        expected = [importlib.metadata.version(d) for d in scan.get(module.split(".")[0], ())]
        assert module_version(module) == expected[0], module
    code = (
        "from mindspeed_rl.utils import env_probe; "
        f"[env_probe.module_version(m) for m in {REPORTED_MODULES + ('ray',)!r}]; "
        "print(env_probe._distributions_of.cache_info().misses)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "0"


def test_the_driver_and_the_control_unit_load_no_engine_stack() -> None:
    # The driver's path to an async run with role envs, and a Control Unit built from its plan, in
    # a fresh interpreter whose environment holds every stack (this .venv): none gets imported.
    code = """
import json, sys
from pathlib import Path
from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.trainer import grpo_trainer_async, async_cluster, startup, role_processes  # noqa: F401
from mindspeed_rl.workers.control_unit import ControlUnit
import cli.train_grpo  # noqa: F401
plan = build_run_plan(load_config_from_files(Path("configs"), "grpo_tiny_megatron", [
    "++async_config.role_envs.trainer.python=/envs/trainer/bin/python",
    "++async_config.role_envs.rollout.python=/envs/rollout/bin/python",
]))
cu = ControlUnit(plan.runtime, ())
print(json.dumps(sorted(m for m in ("torch", *ENGINES) if m in sys.modules)))
""".replace("ENGINES", repr(ENGINE_MODULES))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_a_colocated_hybrid_rank_on_npu_names_what_its_one_environment_lacks() -> None:
    # The colocated hybrid needs both roles' stacks in one process. An Ascend trainer-set env
    # (MindSpeed, no vllm-ascend) is refused before any model loads, naming the missing modules
    # and the async pipeline with one environment per role.
    trainer_set = {
        "ray", "numpy", "torch", "safetensors", "transformers", "yaml", "megatron.core", "torch_npu", "mindspeed",
    }  # fmt: skip
    find = lambda name: object() if name in trainer_set else None  # noqa: E731
    missing = missing_in_one_process(megatron=True, rollout_backend="vllm", device_kind="NPU", find=find)
    assert missing == ("vllm", "vllm_ascend")
    text = one_process_refusal(missing, "NPU")
    assert "lacks vllm, vllm_ascend" in text and "rl_config.pipeline: async" in text and "TRAINER_ENV" in text
    # The same env with the rollout stack added has nothing missing; on GPU, TE-less megatron is
    # the engine's own concern, not this check's.
    both = trainer_set | {"vllm", "vllm_ascend"}
    assert (
        missing_in_one_process(
            megatron=True,
            rollout_backend="vllm",
            device_kind="NPU",
            find=lambda n: object() if n in both else None,
        )
        == ()
    )
    # This machine's .venv (the tests' one environment) holds everything a CPU colocated run needs.
    assert missing_in_one_process(megatron=True, rollout_backend="vllm", device_kind=None) == ()
