"""Fig. 2 shape from the simulator: iteration time vs generation capacity for one TU.

    python benchmarks/sim_fig2.py [--preset configs/sim/qwen3_30b_a3b.yaml] [--gus 1 2 3 4 6 8] --json OUT

For the preset's timing profile (default: the paper's Qwen3-30B-A3B breakdown) and its C4 (full
ASP) schedule, simulates the pipeline with 1..8 GUs and prints the simulated mean iteration time
(warm-up excluded), the steady-rate prediction and the bottleneck side. Expected: iteration time
falls roughly as 1/actors while generation is the bottleneck, then flattens at ~T_train. Also
checks Eq. 4 on the preset's own cluster: measured d_off against Q_arrival + (T_save + T_convert +
T_load + T_gen) / T_train (the paper: Q + 3.3).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindspeed_rl.sim.conditions import build_condition_schedules
from mindspeed_rl.sim.preset import SimPreset
from mindspeed_rl.sim.runner import duty_cycle_estimate, eq4_constant, simulate_schedule
from mindspeed_rl.sim.scaling import project_scaling

DEFAULT_PRESET = Path(__file__).resolve().parents[1] / "configs" / "sim" / "qwen3_30b_a3b.yaml"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default=str(DEFAULT_PRESET))
    p.add_argument("--gus", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    p.add_argument("--condition", default="C4", choices=["C0", "C1", "C2", "C3", "C4"])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    preset = SimPreset.from_yaml(args.preset)
    workload = preset.load_workload()
    built = build_condition_schedules(workload, preset.schedule, [args.condition], tau=preset.tau)
    schedule = built.schedules[args.condition]
    points = project_scaling(preset, workload, schedule, args.gus)
    print(
        f"{preset.name}: T_train {preset.profile.train.per_step_seconds}s, {preset.cluster.actors_per_gu} actors/GU"
    )
    print("| GUs | actors | simulated iteration (s) | predicted (s) | bottleneck | queue max | d_off |")
    print("|---|---|---|---|---|---|---|")
    for pt in points:
        d_off = "n/a" if pt.d_off_measured_mean is None else f"{pt.d_off_measured_mean:.2f}"
        print(
            f"| {pt.num_generation_units} | {pt.num_actors} | {pt.mean_iteration_seconds:.1f} | "
            f"{pt.predicted_iteration_seconds:.1f} | {pt.bottleneck} | {pt.queue_max_samples} | {d_off} |"
        )

    own = simulate_schedule(preset, workload, schedule, label=args.condition)
    t_gen_ref = preset.reference.t_gen_seconds or own.mean_gen_seconds
    eq4 = {
        "constant_from_reference": eq4_constant(preset.profile, t_gen_ref),
        "constant_from_simulated_means": eq4_constant(preset.profile, own.mean_gen_seconds),
        "q_arrival_mean": own.lag.q_arrival_mean_global_batches,
        "d_off_measured_mean": own.lag.d_off_measured_mean,
        "d_off_eq4_simulated": own.lag.d_off_eq4,
        "duty_cycle_estimate": duty_cycle_estimate(preset.profile, t_gen_ref),
        "duty_cycle_simulated": own.duty_cycle,
    }
    print(
        f"Eq. 4 on the preset cluster: d_off ~ Q + {eq4['constant_from_reference']:.2f} (reference T_gen), "
        f"simulated T_gen {own.mean_gen_seconds:.1f}s; Q_arrival {eq4['q_arrival_mean']:.2f}, "
        f"measured d_off {eq4['d_off_measured_mean']:.2f} vs Eq. 4 {eq4['d_off_eq4_simulated']:.2f}; "
        f"duty cycle {eq4['duty_cycle_simulated']:.3f} (estimate {eq4['duty_cycle_estimate']:.3f})"
    )
    elapsed = time.perf_counter() - t0
    print(f"done in {elapsed:.1f}s")
    if args.json:
        out = {
            "preset": preset.name,
            "condition": args.condition,
            "points": [pt.to_dict() for pt in points],
            "eq4": eq4,
            "seconds": elapsed,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
