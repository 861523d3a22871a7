"""Validate a GRPO config without running it.

    python cli/check_config.py --config-name grpo_tiny_cpu [--config-dir DIR] [key=value ...]

Prints the resolved, typed config as JSON (stdout) and exits 0; on a bad config prints what is
wrong and how to fix it (stderr, no traceback) and exits 2. It builds the same run plan as
``train_grpo.py`` (``plan.build.build_run_plan``), so every configuration error the run
would raise (unsupported keys, layouts, queue/lag rules) is raised here, before any model or data
work. ``--available CPU=2,NPU=16`` also checks that the plan's actors fit one node with those
resources. ``--cluster NxD`` (N nodes of D devices; ``NxDxC`` also gives C CPUs per node, else
CPUs are not checked) prints, instead of the config, the placement as JSON: node and device
indices of every trainer rank and generation actor (``utils.placement``) and, when the YAML's
``model:`` gives the shape, ``memory_gb`` of each by term (``plan.memory``; exit 2 naming the rank,
its largest term and a key that shrinks it when one does not fit ``--device-memory-gb``); the device kind is NPU
when the config asks ``num_npus``, GPU when it asks ``num_gpus`` (a CPU-only config uses no
devices). The run does the same check against its live cluster's nodes. A colocated hybrid on
devices also gets its start-up memory on stderr, with or without ``--cluster``
(``plan.memory.ColocatedStart``: what a trainer rank keeps on its device when its rollout engine
starts, against the ``(1 - gpu_memory_utilization) x`` device memory vLLM leaves, and the peak of
each weight push), and exit 2 naming the key to change when it would not start. Keys that have no effect
here are listed on stderr (``--list-inert`` prints only that list, on stdout).

``--placement-dry-run`` joins the running Ray cluster (``--fake-cluster NxD``: starts Ray's test
cluster with N nodes of D fake devices instead), reserves the run's placement groups, starts one
placeholder per trainer rank and rollout actor with the run's runtime_env, prints where each
landed, its visible devices and the device index it would bind (``utils.placement_dry_run``),
releases everything, and exits 2 if anything differs from the plan. With
``async_config.role_envs`` it first probes each role's interpreter on this node (a missing one,
or one lacking a module its role needs, is refused by name: exit 2), then starts every placeholder
in its role's environment and reports, per role, the interpreter each actor started in.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.config_cls.notes import batch_notes
from mindspeed_rl.plan.build import RunPlan, build_run_plan
from mindspeed_rl.plan.memory_section import colocated_memory, device_memory, placed_memory
from mindspeed_rl.trainer.role_processes import check_plan_envs, plan_modules
from mindspeed_rl.utils.placement import ClusterSpec
from mindspeed_rl.utils.role_env_check import RoleEnvError

REPO_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Validate a GRPO config and print it resolved, as JSON.")
    parser.add_argument("--config-dir", type=Path, default=REPO_CONFIGS, help="folder of run YAMLs")
    parser.add_argument("--config-name", required=True, help="run YAML name, without .yaml")
    parser.add_argument("--list-inert", action="store_true", help="print only the keys with no effect here")
    parser.add_argument(
        "--available",
        type=parse_available,
        default=None,
        help="cluster resources to check the plan's actors against, e.g. CPU=2 or CPU=64,NPU=16",
    )
    parser.add_argument(
        "--cluster",
        type=parse_cluster,
        default=None,
        help="N nodes of D devices (8x8; 8x8x192 also checks 192 CPUs per node): print the placement as JSON",
    )
    parser.add_argument(
        "--device-memory-gb",
        type=float,
        default=None,
        help="with --cluster: memory of one device (default: 64 for NPU, 80 for GPU)",
    )
    parser.add_argument(
        "--placement-dry-run",
        action="store_true",
        help="reserve the placement on the Ray cluster, start a placeholder per rank/actor, print where each landed",
    )
    parser.add_argument(
        "--fake-cluster",
        type=parse_cluster,
        default=None,
        help="with --placement-dry-run: Ray's test cluster of N nodes of D fake devices (2x8) instead of address=auto",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. rl_config.pipeline=async")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config_from_files(args.config_dir, args.config_name, args.overrides)
        plan = build_run_plan(config)
        if args.available is not None:
            plan.check_fits(args.available)
        placement = plan.check_fits(args.cluster) if args.cluster is not None else None
        if args.placement_dry_run:
            return placement_dry_run(plan, args.fake_cluster)
    except (ValueError, RoleEnvError) as err:  # ConfigError is a ValueError; so are the plan's refusals
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.list_inert:
        for key in plan.inert_keys:
            print(key)
        return 0
    colocated = colocated_start(plan, args.device_memory_gb)
    if placement is not None:
        placed = placement.to_dict()
        if plan.memory is not None:
            memory = placed_memory(plan.memory, placement, args.device_memory_gb, plan.offload)
            placed["memory_gb"] = memory
            if memory["problem"] is not None:
                print(json.dumps(placed, indent=2))
                print(f"error: device memory: {memory['problem']}", file=sys.stderr)
                return 2
        print(json.dumps(placed, indent=2))
    elif colocated is not None and colocated["problem"] is not None:
        print(f"error: device memory: {colocated['problem']}", file=sys.stderr)
        return 2
    else:
        print(json.dumps(config.to_dict(), indent=2))
    for note in batch_notes(config):
        print(f"note: {note}", file=sys.stderr)
    if plan.inert_keys:
        print(f"note: {len(plan.inert_keys)} given key(s) have no effect here:", file=sys.stderr)
        for key in plan.inert_keys:
            print(f"  {key}", file=sys.stderr)
    return 0


def colocated_start(plan: RunPlan, device_memory_gb: float | None) -> dict[str, Any] | None:
    """A colocated hybrid's start-up memory (``plan.memory_section.colocated_memory``), printed on
    stderr; None (and a note saying why) where there is none to plan."""
    if plan.offload is None:
        return None  # trainer and rollout never share a device
    kind = plan.placement.device_kind
    if kind is None or plan.memory is None:
        why = "a CPU host has no device memory" if kind is None else "the YAML's model: gives no shape"
        print(f"note: colocated start-up memory not planned: {why}", file=sys.stderr)
        return None
    memory = device_memory(kind, device_memory_gb)
    start = colocated_memory(plan.memory, plan.offload, memory)
    print(
        f"colocated start-up ({kind}, {memory:g} GB): the trainer keeps {start['resident_at_engine_start']:g} GB "
        f"on its device when the rollout engine starts, {start['allowed']:g} GB allowed "
        f"((1 - gpu_memory_utilization {plan.memory.rollout.gpu_memory_utilization:g}) x {memory:g} GB); "
        f"each push peaks at {start['push_peak']:g} GB (the fullest rank: pipeline stage {start['pipeline_stage']})",
        file=sys.stderr,
    )
    return start


def placement_dry_run(plan: RunPlan, fake: ClusterSpec | None) -> int:
    from mindspeed_rl.utils import placement_dry_run as dry
    from mindspeed_rl.utils.ray_setup import REPO_RUNTIME_ENV, load_runtime_env

    kind = plan.placement.device_kind
    if kind is None:
        raise ValueError(
            "this config runs on CPU only (no num_npus / num_gpus): there is no device placement to dry-run"
        )
    runtime_env = load_runtime_env(plan.runtime_env_path or REPO_RUNTIME_ENV)
    # Each role's interpreter on this node, before any Ray work: a missing one is refused by name.
    # On a fake cluster the device stacks (torch_npu, vllm_ascend, ...) are reported, not required.
    envs = plan.async_spec.role_envs if plan.async_spec is not None else None
    reports = check_plan_envs(plan, require_modules=fake is None)
    modules = plan_modules(plan) if envs is not None else None
    cluster = dry.fake_cluster(fake, kind, runtime_env) if fake else dry.connected_cluster(kind, runtime_env)
    with cluster as live:
        placement = plan.check_fits(live)
        result = dry.dry_run(placement, envs, modules, require_modules=fake is None)
        if reports is not None:
            for role, report in reports.items():
                result["role_envs"][role]["probe"] = report.to_json()
        if plan.offload is not None and plan.trainer.megatron is not None:  # a colocated megatron hybrid
            from mindspeed_rl.workers.colocated_probe import rank_group

            group = rank_group(plan.trainer, plan.trainer_resources, plan.rollout, placement)
            result["rank_group"] = group
            result["problems"] += group["problems"]
            result["ok"] = result["ok"] and group["ok"]
    print(json.dumps(result, indent=2))
    for problem in result["problems"]:
        print(f"error: {problem}", file=sys.stderr)
    return 0 if result["ok"] else 2


def parse_cluster(text: str) -> ClusterSpec:
    try:
        return ClusterSpec.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_available(text: str) -> dict[str, float]:
    """``CPU=2,NPU=16`` -> {"CPU": 2.0, "NPU": 16.0} (Ray's resource names)."""
    out: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        name, sep, amount = item.partition("=")
        try:
            out[name.strip()] = float(amount)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(f"cannot parse {item!r}; write KIND=AMOUNT, e.g. CPU=2,NPU=16")
    return out


if __name__ == "__main__":
    sys.exit(main())
