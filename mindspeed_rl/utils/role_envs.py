"""Per-role Python environments of the async pipeline (``async_config.role_envs``), as the plan
carries them and as Ray starts them.

::

    driver, Control Unit ─────────────── the environment Ray was started from (light: no engine stack)
    Training Unit (its ranks) ─────────── role_envs.trainer.python   e.g. MindSpeed + megatron-core 0.12.1 + torch 2.7.1
    Generation Units + their actors ──── role_envs.rollout.python   e.g. vllm-ascend + its vLLM and torch

Why Ray's ``py_executable`` (read in the installed ray 2.60: ``_private/runtime_env/py_executable.py``
sets the worker command to the given interpreter; ``context.py`` execs it): an environment built
ahead on every node (``make setup-npu``, or baked into the image of ``stacks/Dockerfile.ascend``)
costs nothing at actor start and needs nothing on the node but the path. The alternatives in 2.60
fit less well: ``conda`` activates a named env through the node's conda (a conda env's
``bin/python`` works here as a ``py_executable`` just as well), ``pip``/``uv`` build an env per
runtime_env hash on first use (minutes per node, from the network, which Ascend clusters often lack),
and ``image_uri``/``container`` run each worker under podman (``image_uri.py``), which needs podman
on every node, the NPU devices and driver mounted through run_options, and combines only with
``env_vars``/``config``.

The roles exchange only data in this project's snapshot format (``weights/format.py``), plain
records of builtins through the Control Unit, and no pickled torch, vLLM or megatron object; so the
environments may hold different torch, transformers or numpy versions. What they must share: the
Python minor version and the Ray version of the cluster (Ray's own requirement), and the snapshot
format version (``utils.role_env_check`` compares all three before any model loads).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from mindspeed_rl.config_cls.role_envs import RoleEnvsConfig

Role = Literal["trainer", "rollout"]
ROLES: tuple[Role, ...] = ("trainer", "rollout")
RAY_STARTED_FROM = "the environment Ray was started from"

# Modules each role imports on every run (found, not imported, by ``env_probe``).
_COMMON = ("ray", "numpy", "torch", "safetensors", "transformers", "yaml")


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleEnv:
    """One role's environment: its interpreter (None = the one Ray was started from) and extra
    environment variables of its actors."""

    role: Role
    python: str | None = None
    env_vars: Mapping[str, str] = field(default_factory=dict)

    @property
    def own(self) -> bool:
        """Whether the role runs in an environment of its own (not the one Ray was started from)."""
        return self.python is not None or bool(self.env_vars)

    def describe(self) -> str:
        return self.python or RAY_STARTED_FROM

    def runtime_env(self, job: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The actors' Ray ``runtime_env``: the job's (``ray.get_runtime_context().runtime_env``:
        configs/envs/runtime_env.yaml and the log hook) with this role's interpreter and its
        variables over the job's. Merged here rather than left to Ray, so what an actor gets does
        not depend on Ray's inheritance rules."""
        out = {k: v for k, v in (job or {}).items() if k != "py_executable"}
        env_vars = {**dict(out.get("env_vars") or {}), **self.env_vars}
        if env_vars:
            out["env_vars"] = env_vars
        if self.python is not None:
            out["py_executable"] = self.python
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleEnvs:
    trainer: RoleEnv
    rollout: RoleEnv

    def of(self, role: Role) -> RoleEnv:
        return self.trainer if role == "trainer" else self.rollout

    def summary(self) -> dict[str, str]:
        return {role: self.of(role).describe() for role in ROLES}


def role_envs_from_config(config: RoleEnvsConfig | None) -> RoleEnvs | None:
    """The plan's record of ``async_config.role_envs`` (None when not set)."""
    if config is None:
        return None
    envs = {}
    for role in ROLES:
        c = config.trainer if role == "trainer" else config.rollout
        if c.python is not None and not c.python.strip():
            raise ValueError(
                f"async_config.role_envs.{role}.python is empty; give the interpreter of the "
                f"{role} environment (e.g. /opt/envs/{role}/bin/python) or null for {RAY_STARTED_FROM}"
            )
        envs[role] = RoleEnv(role=role, python=c.python, env_vars=dict(c.env_vars or {}))
    return RoleEnvs(trainer=envs["trainer"], rollout=envs["rollout"])


def role_runtime_env(envs: RoleEnvs | None, role: Role) -> dict[str, Any] | None:
    """The runtime_env of ``role``'s actors on the connected cluster; None without role envs."""
    if envs is None or not envs.of(role).own:
        return None
    import ray

    return envs.of(role).runtime_env(ray.get_runtime_context().runtime_env)


def role_options(runtime_env: Mapping[str, Any] | None, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` (an actor's Ray options) with ``runtime_env`` when there is one."""
    out = dict(options)
    if runtime_env is not None:
        out["runtime_env"] = dict(runtime_env)
    return out


def required_modules(
    role: Role, *, megatron: bool, rollout_backend: str, device_kind: str | None
) -> tuple[str, ...]:
    """What ``role``'s environment must provide for this run (module names, as imported)."""
    out = list(_COMMON)
    npu = device_kind == "NPU"
    if role == "trainer":
        if megatron:
            out.append("megatron.core")
        if npu:
            # MindSpeed adapts megatron-core to the NPU; the torch engine needs torch_npu only.
            out += ["torch_npu", "mindspeed"] if megatron else ["torch_npu"]
    else:
        vllm = rollout_backend == "vllm"
        if vllm:
            out.append("vllm")
        if npu:
            out += ["torch_npu", "vllm_ascend"] if vllm else ["torch_npu"]
    return tuple(out)


HYBRID_REFUSAL = (
    "async_config.role_envs: the hybrid pipeline (rl_config.pipeline: hybrid) cannot run its trainer "
    "and its rollout engine in two environments: on GPU/NPU each trainer rank hosts its rollout "
    "engine shard in the same process (colocated: sleep/wake and offload on shared devices), and one "
    "process has one Python environment; on CPU the trainer hands its torch tensors straight to the "
    "rollout actor, which is no snapshot-format contract. Use rl_config.pipeline: async (the Training "
    "Unit and the Generation Units are separate actors that exchange snapshots), or remove "
    "async_config.role_envs and install one environment with both stacks. On Ascend no such "
    "environment exists with vllm-ascend >= 0.23 (MindSpeed needs torch 2.7.1 and numpy <= 1.26: "
    "stacks/ascend-trainer.txt, stacks/ascend-rollout.txt), and vllm-ascend 0.11's vLLM cannot reload "
    "weights in place (models/rollout/vllm_reload.py)."
)


def missing_in_one_process(
    *,
    megatron: bool,
    rollout_backend: str,
    device_kind: str | None,
    find: Callable[[str], object | None] | None = None,
) -> tuple[str, ...]:
    """The modules a colocated hybrid rank (trainer and rollout engine in one process) lacks here:
    both roles' requirements, looked up without importing (``find`` is ``importlib.util.find_spec``)."""
    import importlib.util

    def present(name: str) -> bool:
        try:
            return (find or importlib.util.find_spec)(name) is not None
        except (ImportError, ValueError):  # a parent package that is itself missing or broken
            return False

    wanted = dict.fromkeys(
        required_modules(
            "trainer", megatron=megatron, rollout_backend=rollout_backend, device_kind=device_kind
        )
        + required_modules(
            "rollout", megatron=megatron, rollout_backend=rollout_backend, device_kind=device_kind
        )
    )
    return tuple(name for name in wanted if not present(name))


def one_process_refusal(missing: Sequence[str], device_kind: str | None) -> str:
    """Why a colocated hybrid rank cannot start in this environment, and what to do instead."""
    text = (
        f"rl_config.pipeline: hybrid (colocated) runs the trainer and the rollout engine in one process, "
        f"and this environment lacks {', '.join(missing)}."
    )
    if device_kind == "NPU":
        text += (
            " On Ascend no one environment holds MindSpeed (torch 2.7.1, numpy <= 1.26) and vllm-ascend "
            ">= 0.23 (torch 2.10, numpy >= 2): stacks/ascend-trainer.txt, stacks/ascend-rollout.txt. "
            "Run the async pipeline with one environment per role instead (rl_config.pipeline: async, "
            "TRAINER_ENV / ROLLOUT_ENV with examples/ray_launch.sh, docs/guides/ascend.md)."
        )
    else:
        text += " Install both stacks into this environment, or run rl_config.pipeline: async."
    return text
