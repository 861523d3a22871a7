"""The start-up check of an async run's per-role environments (``async_config.role_envs``).

::

    check_role_envs(envs, ...)     before Ray work or any model load, on the driver's node
                                   (``trainer.role_processes.check_plan_envs`` for a run plan):
      each role: <python> -m mindspeed_rl.utils.env_probe --modules <what the role needs>
      refuse, naming the role, the interpreter and the fix:
        - an interpreter that is not there
        - an environment that cannot import this project, or lacks a module its role needs, or
          holds a module Ray imports in every worker that fails to import (pyarrow for another numpy)
        - a Python minor or Ray version other than the driver's (Ray's own requirement)
        - trainer and rollout speaking different snapshot format versions (both named)
        - weight_transport: collective across two torch versions (its buckets travel through
          torch.distributed, whose wire protocol is per torch version)
    compare_live(trainer, rollout)  once the actors exist, from their own processes: the same
                                     format check, for nodes whose environment differs from the
                                     driver's (``AsyncCluster`` calls it before the weight flow)

The driver's node is the only one the first step sees; ``examples/ray_launch.sh`` runs the same
probe on every node it starts before it joins the cluster.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from mindspeed_rl.utils.env_probe import RAY_IMPORTS, EnvReport
from mindspeed_rl.utils.role_envs import ROLES, Role, RoleEnv, RoleEnvs, required_modules

PROBE_TIMEOUT_S = 120.0
STACK_FILES = {"trainer": "stacks/ascend-trainer.txt", "rollout": "stacks/ascend-rollout.txt"}
GPU_STACK_FILES = {"trainer": "stacks/gpu-trainer.txt", "rollout": "stacks/gpu-rollout.txt"}


class RoleEnvError(RuntimeError):
    """A role's environment cannot run its role; the message names the role, the environment and the fix."""


def expand_env_vars(env_vars: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """``${VAR}`` in the values expanded against ``environ``, unknown ones dropped: what Ray's
    ``update_envs`` does in the worker (ray 2.60, ``_private/utils.py``)."""
    out = {}
    for key, value in env_vars.items():
        expanded = re.sub(r"\$\{([A-Za-z0-9_]+)\}", lambda m: environ.get(m.group(1), ""), value)
        out[key] = expanded
    return out


def probe(
    env: RoleEnv,
    modules: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> EnvReport:
    """Run ``env_probe`` in ``env``'s interpreter (this one when it names none)."""
    environ = dict(os.environ if environ is None else environ)
    python = env.python or sys.executable
    where = f"async_config.role_envs.{env.role}.python={python}"
    if env.python is not None and not (Path(python).is_file() and os.access(python, os.X_OK)):
        raise RoleEnvError(
            f"{where}: there is no such interpreter on node {socket.gethostname()!r}. Build the "
            f"{env.role} environment on every node ({_how_to_build(env.role)}), or fix the path"
        )
    command = [python, "-m", "mindspeed_rl.utils.env_probe", "--modules", ",".join(modules)]
    command += ["--imports", ",".join(RAY_IMPORTS)]
    try:
        done = subprocess.run(
            command,
            env={**environ, **expand_env_vars(env.env_vars, environ)},
            # `-m` puts the working directory first on sys.path: the interpreter's own folder holds
            # no copy of the project, so the one found is the environment's (or its PYTHONPATH's).
            cwd=os.path.dirname(python),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise RoleEnvError(f"{where}: the environment probe did not finish in {timeout_s:g} s") from None
    except OSError as err:
        raise RoleEnvError(f"{where}: cannot run it ({err})") from None
    if done.returncode != 0:
        cause = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RoleEnvError(
            f"{where}: this project's environment probe fails there ({cause}). Install the project "
            f"into that environment (pip install --no-deps -e <this checkout>) or put the checkout on its "
            f"path (async_config.role_envs.{env.role}.env_vars.PYTHONPATH)"
        )
    return EnvReport.from_json(json.loads(done.stdout.strip().splitlines()[-1]))


def problems_of(
    reports: Mapping[Role, EnvReport],
    envs: RoleEnvs,
    base: EnvReport,
    *,
    one_torch_transport: str | None,
    require_modules: bool = True,
) -> list[str]:
    """Everything wrong with the probed environments (empty: both can run their roles).
    ``one_torch_transport``: the run's weight transport when it needs one torch on both sides
    (``Transport.needs_one_torch``), else None. ``require_modules=False`` (a dry run on a fake
    cluster): missing modules are not problems."""
    out = []
    for role in ROLES:
        r, env = reports[role], envs.of(role)
        name = f"the {role} environment ({env.describe()})"
        if r.missing() and require_modules:
            out.append(
                f"{name} lacks {', '.join(r.missing())}, which the {role} needs for this run; install "
                f"{'them' if len(r.missing()) > 1 else 'it'} there ({_how_to_build(role)})"
            )
        for module, error in r.broken.items():
            out.append(
                f"{name} has {module} installed, but it fails to import ({error}); Ray imports it in every "
                f"worker, so every {role} actor would die at start: install a {module} built for that "
                f"environment's numpy, or uninstall it there"
            )
        if r.python_minor() != base.python_minor():
            out.append(
                f"{name} runs Python {r.python_version}, the driver and Ray {base.python_version}: Ray needs "
                f"one Python version across a cluster; build the {role} environment with Python {base.python_minor()}"
            )
        if r.ray_version != base.ray_version:
            out.append(
                f"{name} has ray {r.ray_version}, the cluster ray {base.ray_version}: install "
                f"ray=={base.ray_version} there (every process of a Ray cluster runs one Ray version)"
            )
    out += format_problems(reports["trainer"], reports["rollout"], envs)
    trainer_torch, rollout_torch = (reports[r].packages.get("torch") for r in ROLES)
    if one_torch_transport and trainer_torch and rollout_torch and trainer_torch != rollout_torch:
        out.append(
            f"async_config.weight_transport={one_torch_transport} sends the weights through torch.distributed between "
            f"the roles, which needs one torch version on both sides; the trainer environment has torch "
            f"{trainer_torch}, the rollout environment torch {rollout_torch}. Use weight_transport: shared_fs "
            "or object_store (snapshot files or byte buffers: any torch on either side)"
        )
    return out


def format_problems(trainer: EnvReport, rollout: EnvReport, envs: RoleEnvs | None = None) -> list[str]:
    """A snapshot format mismatch, naming both sides' versions and where each copy of the project is."""
    if trainer.snapshot_format == rollout.snapshot_format:
        return []
    t_where = envs.trainer.describe() if envs else trainer.executable
    r_where = envs.rollout.describe() if envs else rollout.executable
    return [
        f"snapshot format mismatch: the trainer environment ({t_where}, mindspeed_rl at {trainer.project_path}) "
        f"writes snapshot format {trainer.snapshot_format}, the rollout environment ({r_where}, mindspeed_rl at "
        f"{rollout.project_path}) reads snapshot format {rollout.snapshot_format}; install one version of this "
        "project in both environments (weights/format.py)"
    ]


def check_role_envs(
    envs: RoleEnvs,
    modules: Mapping[Role, Sequence[str]],
    *,
    one_torch_transport: str | None,
    environ: Mapping[str, str] | None = None,
    require_modules: bool = True,
) -> dict[Role, EnvReport]:
    """Probe and check both roles' environments (``modules``: what each must provide). Raises
    ``RoleEnvError`` listing every problem at once. ``require_modules=False``: report the modules
    a role lacks without refusing them (a placement dry run on a fake cluster, whose host has no
    accelerator stack)."""
    reports = {role: probe(envs.of(role), modules[role], environ=environ) for role in ROLES}
    problems = problems_of(
        reports,
        envs,
        EnvReport.here(),
        one_torch_transport=one_torch_transport,
        require_modules=require_modules,
    )
    if problems:
        raise RoleEnvError(
            "async_config.role_envs refused before any model loads:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    return reports


def _how_to_build(role: str) -> str:
    return (
        f"`make setup-npu` builds it from {STACK_FILES[role]} with stacks/setup_role_envs.sh; "
        f"GPU: {GPU_STACK_FILES[role]}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``node --role R --python P [--device npu|cuda|cpu] [--megatron]``: one node's check of one
    role's environment against this interpreter's Python and Ray (``examples/ray_launch.sh`` and
    ``stacks/setup_role_envs.sh`` run it on every node); exit 2 naming what is missing."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mindspeed_rl.utils.role_env_check")
    sub = parser.add_subparsers(dest="command", required=True)
    node = sub.add_parser("node", help="check one role's environment on this node")
    node.add_argument("--role", choices=ROLES, required=True)
    node.add_argument("--python", required=True, help="the role environment's interpreter")
    node.add_argument("--device", choices=("cpu", "cuda", "npu"), default="cpu")
    node.add_argument("--megatron", action="store_true", help="the trainer runs the megatron engine")
    node.add_argument("--rollout-backend", choices=("vllm", "hf"), default="vllm")
    args = parser.parse_args(argv)
    kind = {"cpu": None, "cuda": "GPU", "npu": "NPU"}[args.device]
    env = RoleEnv(role=args.role, python=args.python)
    try:
        modules = required_modules(
            args.role, megatron=args.megatron, rollout_backend=args.rollout_backend, device_kind=kind
        )
        report = probe(env, modules)
        other = RoleEnv(role="rollout" if args.role == "trainer" else "trainer")
        envs = (
            RoleEnvs(trainer=env, rollout=other)
            if args.role == "trainer"
            else RoleEnvs(trainer=other, rollout=env)
        )
        base = EnvReport.here()
        # The other role is this interpreter here: only this role's own problems are reported.
        problems = problems_of({args.role: report, other.role: base}, envs, base, one_torch_transport=None)
    except RoleEnvError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    found = ", ".join(f"{m} {v or '(source)'}" for m, v in report.packages.items())
    print(
        f"{args.role} environment {args.python} on {socket.gethostname()}: Python {report.python_version}, {found}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
