"""Recommend a TU/GU split with generation a mild bottleneck (the paper's heuristic, App. B.6).

    python cli/plan_allocation.py --total-devices 32 --tu 8:287.6 --actor-devices 2 \\
        --gen-seconds 763.3 --prompts-per-minibatch 4 --global-batch 16 --load-seconds 73.9 [--verify 40]
    python cli/plan_allocation.py --preset configs/sim/qwen3_30b_a3b.yaml --tu-devices 8 \\
        --total-devices 64 --actor-devices 2 --actors-per-gu 4

Measured inputs: T_train per step for each TU size you can run (``--tu DEVICES:SECONDS``, several
allowed: the planner grows the TU when devices remain), and the time one actor on the smallest
slice takes for one minibatch. A preset supplies whatever is not given explicitly (T_train from
``profile.train``, T_gen from ``reference.t_gen_seconds``, minibatch size ``schedule.b``, global
batch and weight-flow times). Prints the plan, predicted iteration time, queue behaviour and d_off
(Eq. 4); ``--verify N`` also simulates N iterations of the plan.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindspeed_rl.sim.planner import (
    PlannerInputs,
    TrainingUnitOption,
    format_plan,
    options_from_pairs,
    recommend,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--total-devices", type=int, required=True)
    p.add_argument("--tu", nargs="+", default=None, help="TU sizes with measured step time: DEVICES:SECONDS")
    p.add_argument("--preset", default=None, help="simulation preset YAML supplying defaults")
    p.add_argument("--tu-devices", type=int, default=None, help="TU size the preset's T_train belongs to")
    p.add_argument("--actor-devices", type=int, default=1, help="devices of one generation actor")
    p.add_argument("--gen-seconds", type=float, default=None, help="one minibatch on one actor (s)")
    p.add_argument("--prompts-per-minibatch", type=float, default=None)
    p.add_argument("--global-batch", type=int, default=None, help="prompts per trainer step")
    p.add_argument("--load-seconds", type=float, default=None)
    p.add_argument("--save-seconds", type=float, default=None)
    p.add_argument("--convert-seconds", type=float, default=None)
    p.add_argument("--margin", type=float, default=0.1, help="mild: rollout >= (1 - margin) x TU rate")
    p.add_argument(
        "--actors-per-gu", type=int, default=None, help="express the plan in GUs of this many actors"
    )
    p.add_argument("--verify", type=int, default=0, metavar="N", help="simulate N iterations of the plan")
    p.add_argument("--json", default=None, help="write the plan (and check) here")
    return p


def _preset_defaults(args: argparse.Namespace) -> dict[str, Any]:
    if args.preset is None:
        return {}
    from mindspeed_rl.sim.preset import SimPreset

    preset = SimPreset.from_yaml(args.preset)
    wf = preset.profile.weight_flow
    defaults: dict[str, Any] = {
        "prompts_per_minibatch": float(preset.schedule.b),
        "global_batch": int(preset.runtime["num_prompts_per_global_batch"]),
        "load_seconds": wf.load_seconds,
        "save_seconds": wf.save_seconds,
        "convert_seconds": wf.convert_seconds,
        "gen_seconds": preset.reference.t_gen_seconds,
    }
    if args.tu is None:
        if args.tu_devices is None:
            raise ValueError(
                "with --preset and no --tu, give --tu-devices: the TU size its T_train was measured on."
            )
        defaults["tu"] = (
            TrainingUnitOption(
                num_devices=args.tu_devices, train_seconds=preset.profile.train.per_step_seconds
            ),
        )
    return defaults


def inputs_from_args(args: argparse.Namespace) -> PlannerInputs:
    defaults = _preset_defaults(args)

    def pick(name: str, fallback: Any = None) -> Any:
        value = getattr(args, name)
        value = defaults.get(name, fallback) if value is None else value
        if value is None:
            raise ValueError(f"--{name.replace('_', '-')} is required (or give a --preset that supplies it).")
        return value

    tu = options_from_pairs(args.tu) if args.tu is not None else defaults.get("tu")
    if tu is None:
        raise ValueError("give --tu DEVICES:SECONDS (measured TU step time), or --preset with --tu-devices.")
    return PlannerInputs(
        total_devices=args.total_devices,
        training_options=tuple(tu),
        actor_devices=args.actor_devices,
        gen_seconds=float(pick("gen_seconds")),
        prompts_per_minibatch=float(pick("prompts_per_minibatch")),
        num_prompts_per_global_batch=int(pick("global_batch")),
        load_seconds=float(pick("load_seconds", 0.0)),
        save_seconds=float(pick("save_seconds", 0.0)),
        convert_seconds=float(pick("convert_seconds", 0.0)),
        margin=args.margin,
        actors_per_gu=args.actors_per_gu,
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    inputs = inputs_from_args(args)
    plan = recommend(inputs)
    print(format_plan(plan, inputs))
    report: dict[str, Any] = {"inputs": _inputs_dict(inputs), "plan": plan.to_dict()}
    if args.verify:
        from mindspeed_rl.sim.plan_check import verify_plan

        check = verify_plan(plan, inputs, num_iterations=args.verify)
        print(
            f"simulated ({check.num_iterations} iterations): steady-state iteration "
            f"{check.simulated_iteration_seconds:.1f}s vs predicted {check.predicted_iteration_seconds:.1f}s; "
            f"queue max {check.queue_max_samples} samples; measured d_off {check.d_off_measured_mean}"
        )
        report["check"] = check.to_dict()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


def _inputs_dict(inputs: PlannerInputs) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(inputs)


if __name__ == "__main__":
    sys.exit(main())
