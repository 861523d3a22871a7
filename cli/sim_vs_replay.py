"""Simulate a finished trace replay on its exact settings and put the two Table 4b's side by side.

    python cli/sim_vs_replay.py --report runs/replay_table4b.json --fit-from C2 [--json out.json]

The timing profile is calibrated from one replayed condition (``--fit-from``, see
``mindspeed_rl.sim.calibrate``): per-minibatch decode fit, trainer busy time, snapshot
save/convert/reload medians. Every condition in the report is then simulated with the replay's
workload (lengths clipped as the engine was forced), dispatch order (rebuilt, and checked against
the run's ``replay_plan.json``), runtime settings and cluster shape. Conditions other than
``--fit-from`` are out of sample; ``--fit-from all`` pools every condition's minibatches, which
averages out the host's load over the whole replay. Nothing runs on Ray; this takes seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli import replay_trace
from mindspeed_rl.sim.calibrate import Calibration, calibrate_run_dirs
from mindspeed_rl.sim.table4b import Table4bRow, table4b_row


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", required=True, help="JSON written by cli/replay_trace.py --json")
    p.add_argument(
        "--fit-from",
        default="C2",
        help="replayed condition(s) whose runs calibrate the profile: one name, a comma list, or 'all'",
    )
    p.add_argument("--no-overhead", action="store_true", help="fit decode without a per-minibatch constant")
    p.add_argument("--json", default=None, help="write the comparison here")
    return p


def simulate_report(report: dict[str, Any], calibration: Calibration) -> dict[str, Table4bRow]:
    """Simulate every condition of ``report`` with ``calibration``'s profile and the replay's settings."""
    from mindspeed_rl.plan.build import runtime_config
    from mindspeed_rl.runtime import ScheduledMinibatch
    from mindspeed_rl.sim.replay import plan_dispatch_order
    from mindspeed_rl.sim.simulator import ClusterShape, Simulator

    args = argparse.Namespace(**report["settings"])
    inputs = replay_trace.replay_inputs(args)
    a = inputs.config.async_config
    cluster = ClusterShape(num_generation_units=a.num_generation_units, actors_per_gu=a.actors_per_unit)
    rows = {}
    for name, plan in inputs.plans.plans.items():
        schedule: list[ScheduledMinibatch] = list(plan.schedule)
        replayed = plan_dispatch_order(report["runs"][name]["run_dir"])
        if [mb.prompt_ids for mb in schedule] != replayed:
            raise ValueError(
                f"{name}: the rebuilt dispatch order differs from the replayed one; the report's settings "
                "or the scheduler changed since the replay ran. Rerun the replay."
            )
        sim = Simulator(
            runtime=runtime_config(inputs.config),
            cluster=cluster,
            profile=calibration.profile,
            workload=inputs.replayed_workload,
            schedule=schedule,
            seed=args.seed,
            label=name,
        )
        result = sim.run()
        rows[name] = table4b_row(
            list(result.events), condition=name, start_time=0.0, skip_first=args.skip_first
        )
    return rows


def compare(report: dict[str, Any], simulated: dict[str, Table4bRow]) -> list[dict[str, Any]]:
    out = []
    for name, sim in simulated.items():
        real = report["runs"][name]["row"]
        error = sim.mean_iteration_seconds / real["mean_iteration_seconds"] - 1.0
        out.append(
            {"condition": name, "replay": real, "sim": sim.to_dict(), "mean_iteration_rel_error": error}
        )
    return out


def format_comparison(rows: list[dict[str, Any]], fit_from: list[str]) -> str:
    lines = [
        "| condition | mean iter replay / sim (s) | error | trend replay / sim | queue STD replay / sim "
        "| queue max replay / sim |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        real, sim = r["replay"], r["sim"]
        tag = " (fit)" if r["condition"] in fit_from else ""
        lines.append(
            f"| {r['condition']}{tag} | {real['mean_iteration_seconds']:.2f} / {sim['mean_iteration_seconds']:.2f} "
            f"| {r['mean_iteration_rel_error']:+.1%} "
            f"| {real['iteration_trend_spearman']:+.2f} / {sim['iteration_trend_spearman']:+.2f} "
            f"| {real['queue_std_samples']:.1f} / {sim['queue_std_samples']:.1f} "
            f"| {real['queue_max_samples']} / {sim['queue_max_samples']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    report = json.loads(Path(args.report).read_text())
    fit_from = sorted(report["runs"]) if args.fit_from == "all" else args.fit_from.split(",")
    unknown = [name for name in fit_from if name not in report["runs"]]
    if unknown:
        print(f"--fit-from {args.fit_from}: {unknown} not in the report's runs {sorted(report['runs'])}.")
        return 2
    calibration = calibrate_run_dirs(
        [report["runs"][name]["run_dir"] for name in fit_from], fit_overhead=not args.no_overhead
    )
    if calibration.unmeasured:
        print(f"not measured in these runs, modelled as 0 s: {', '.join(calibration.unmeasured)}")
    fit = calibration.decode_fit
    print(calibration.profile_yaml())
    print(
        f"decode fit over {fit.num_runs} minibatches: R^2 {fit.r2:.3f}, max relative error {fit.max_relative_error:.1%}"
    )
    rows = compare(report, simulate_report(report, calibration))
    print(format_comparison(rows, fit_from))
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"fit_from": fit_from, "calibration": calibration.to_dict(), "comparison": rows}
        out.write_text(json.dumps(payload, indent=2))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
