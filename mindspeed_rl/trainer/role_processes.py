"""An async run's processes and the environments they run in (``async_config.role_envs``).

::

    live_reports(cluster)               each process's own ``EnvReport``: driver, Control Unit,
                                        Training Unit ranks, Generation Units, generation actors
    check_plan_envs(plan)               before any Ray work: each role's interpreter probed and checked
    check_live(reports)                 the trainer's and every GU's snapshot format agree
                                        (covers nodes whose environment differs from the driver's)

``summary.json`` carries the reports as ``processes``: which interpreter each one ran, which
engine stacks it loaded (the driver and the Control Unit: none) and whether it could import vLLM
or megatron at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mindspeed_rl.utils.env_probe import EnvReport, report_of_process
from mindspeed_rl.utils.role_env_check import RoleEnvError, check_role_envs, format_problems
from mindspeed_rl.utils.role_envs import ROLES, Role, required_modules

if TYPE_CHECKING:
    from mindspeed_rl.plan.build import RunPlan
    from mindspeed_rl.trainer.async_cluster import AsyncCluster
    from mindspeed_rl.utils.role_envs import RoleEnvs

# Looked up (not imported) in every process: their absence from a role's environment is the point.
REPORTED_MODULES = ("torch", "numpy", "transformers", "vllm", "megatron.core")


def plan_modules(plan: RunPlan) -> dict[Role, tuple[str, ...]]:
    """What each role's environment must provide for ``plan``."""
    megatron, backend, kind = (
        plan.trainer.megatron is not None,
        plan.rollout.backend,
        plan.placement.device_kind,
    )
    return {
        role: required_modules(role, megatron=megatron, rollout_backend=backend, device_kind=kind)
        for role in ROLES
    }


def check_plan_envs(
    plan: RunPlan, *, require_modules: bool = True, environ: Mapping[str, str] | None = None
) -> dict[Role, EnvReport] | None:
    """The start-up check of an async plan's role environments (``utils.role_env_check``); None
    when the plan has none."""
    from mindspeed_rl.weights.transports import transport_for

    spec = plan.async_spec
    if spec is None or spec.role_envs is None:
        return None
    transport = transport_for(spec.weight_transport)
    return check_role_envs(
        spec.role_envs,
        plan_modules(plan),
        one_torch_transport=transport.name if transport.needs_one_torch else None,
        environ=environ,
        require_modules=require_modules,
    )


def live_reports(cluster: AsyncCluster, *, actors: bool = True) -> dict[str, Any]:
    """Every process of the run, as it reports itself (JSON-ready). ``actors`` False leaves the
    generation actors out (an empty list): at start-up their engines may still be loading, and
    asking them would wait for that."""
    import ray

    def of(handle: Any) -> Any:
        return handle.__ray_call__.remote(report_of_process, REPORTED_MODULES)

    assert cluster.trainer is not None
    if cluster.trainer.megatron is not None:  # a GroupedTrainingUnit: one report per rank
        trainer = cluster.tu.rank_env_reports.remote(REPORTED_MODULES)
    else:
        trainer = cluster.tu.__ray_call__.remote(_as_list)
    live = [gu for g, gu in cluster.gus.items() if g not in cluster.failed_gus]
    units = [of(gu) for gu in live]
    return {
        "driver": EnvReport.here(REPORTED_MODULES).to_json(),
        "control_unit": ray.get(of(cluster.cu)),
        "trainer_ranks": ray.get(trainer),
        "generation_units": ray.get(units),
        "generation_actors": live_actor_reports(cluster) if actors else [],
    }


def live_actor_reports(cluster: AsyncCluster) -> list[Any]:
    """Every live generation actor's report (each GU asks its own actors)."""
    import ray

    live = [gu for g, gu in cluster.gus.items() if g not in cluster.failed_gus]
    actors = [gu.actor_env_reports.remote(REPORTED_MODULES) for gu in live]
    return [r for reports in ray.get(actors) for r in reports]


def check_live(reports: Mapping[str, Any], envs: RoleEnvs | None) -> None:
    """Refuse a run whose Training Unit and a Generation Unit speak different snapshot formats."""
    trainer = EnvReport.from_json(reports["trainer_ranks"][0])
    problems: list[str] = []
    for unit in reports["generation_units"]:
        problems += format_problems(trainer, EnvReport.from_json(unit), envs)
    if problems:
        raise RoleEnvError(
            "the live actors disagree:\n" + "\n".join(f"  - {p}" for p in dict.fromkeys(problems))
        )


def _as_list(actor: Any) -> list[dict[str, Any]]:
    # Runs in the one-process Training Unit (torch engine).
    return [report_of_process(actor, REPORTED_MODULES)]
