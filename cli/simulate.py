"""Simulate the async pipeline for the scheduling conditions C0–C4 and print Table 4b-style rows.

    python cli/simulate.py --preset configs/sim/qwen3_30b_a3b.yaml [--json out.json]
    python cli/simulate.py --trace lengths.jsonl --scale 0.05 --tau 0.6 --num-generation-units 2 --actors-per-gu 2
    python cli/simulate.py --preset configs/sim/qwen3_30b_a3b.yaml --length-drift hetero2x,noise2x \
        --compare-online --seeds 3 --json out.json

``--compare-online`` runs C4 offline vs C4 online (feedback, refit, re-plan of the unsent tail)
over two epochs under each ``--length-drift`` model and no drift (``mindspeed_rl/sim/drift.py``
documents the models; their parameters are written into the JSON). ``--online-bound`` adds a
run per (drift, seed) that plans on the drift model's own better-informed estimates, a bound on
what online estimates could reach (``DriftModel.informed_estimates``).

Every condition uses the same prompts, predictions (a τ-controlled noisy oracle), cluster and
timing profile; only the dispatch order differs. The real ``ControlLoop`` (dispatch, Training
Queue, backpressure, lag accounting) runs under a simulated clock. Columns: mean iteration time,
Spearman trend of iteration time vs index, Training Queue STD and max (samples); below the table,
measured off-policy distance against Eq. 4 and the generation duty cycle.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindspeed_rl.sim.conditions import CONDITIONS
from mindspeed_rl.sim.preset import ReferenceTimings, SimPreset, TraceSpec
from mindspeed_rl.sim.runner import ConditionsReport, eq4_constant, simulate_conditions, with_cluster
from mindspeed_rl.sim.table4b import format_table
from mindspeed_rl.sim.timing import TrainModel
from mindspeed_rl.sim.workload import Workload

DEFAULT_PRESET = Path(__file__).resolve().parents[1] / "configs" / "sim" / "qwen3_30b_a3b.yaml"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default=str(DEFAULT_PRESET), help="simulation preset YAML")
    p.add_argument("--trace", default=None, help="JSONL length trace replacing the preset's workload")
    p.add_argument("--scale", type=float, default=1.0, help="multiply trace lengths by this")
    p.add_argument("--rows-as-prompts", action="store_true", help="each trace row is a prompt (n = 1)")
    p.add_argument("--num-prompts", type=int, default=None, help="use only the first prompts of the trace")
    p.add_argument("--length-field", default="response_tokens")
    p.add_argument("--id-field", default="prompt_id")
    p.add_argument("--tau", type=float, default=None, help="noisy-oracle Kendall tau (default: preset)")
    p.add_argument("--b", type=int, default=None, help="base minibatch size in prompts")
    p.add_argument("--kappa", type=int, default=None)
    p.add_argument("--k", type=int, default=None, help="batch-group size in minibatches")
    p.add_argument("--sa-iterations", type=int, default=None)
    p.add_argument("--global-batch", type=int, default=None, help="prompts per trainer step")
    p.add_argument("--train-seconds", type=float, default=None, help="fixed trainer step time (s)")
    p.add_argument("--noise-cv", type=float, default=None, help="jitter on decode and train times")
    p.add_argument("--num-generation-units", type=int, default=None)
    p.add_argument("--actors-per-gu", type=int, default=None)
    p.add_argument("--seed", type=int, default=None, help="seed of predictions, SA and jitter")
    p.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=CONDITIONS)
    p.add_argument("--skip-first", type=int, default=0, help="warm-up iterations left out of mean/trend")
    p.add_argument("--json", default=None, help="write the full report here")
    p.add_argument("--series", action="store_true", help="include iteration and queue series in the JSON")
    p.add_argument("--check-invariants", action="store_true", help="ControlLoop.check_invariants per event")
    p.add_argument("--compare-online", action="store_true", help="C4 offline vs online over 2 epochs")
    p.add_argument(
        "--length-drift",
        default="",
        help="comma-separated drift models for --compare-online (hetero2x,noise2x)",
    )
    p.add_argument("--seeds", type=int, default=1, help="--compare-online: seeds 0..N-1")
    p.add_argument(
        "--online-bound",
        action="store_true",
        help="--compare-online: also plan on the drift model's own better-informed estimates "
        "(DriftModel.informed_estimates), a bound on what online estimates could reach",
    )
    p.add_argument("--refit-interval", type=int, default=1, help="--compare-online: steps between refits")
    p.add_argument("--replan-interval", type=int, default=1, help="--compare-online: steps between re-plans")
    return p


def preset_from_args(args: argparse.Namespace) -> SimPreset:
    preset = SimPreset.from_yaml(args.preset)
    if args.trace is not None:
        trace = TraceSpec(
            path=args.trace,
            scale=args.scale,
            group_by_prompt=not args.rows_as_prompts,
            length_field=args.length_field,
            id_field=args.id_field,
            num_prompts=args.num_prompts,
        )
        preset = preset.with_trace(trace)
    sched = {k: getattr(args, k) for k in ("tau", "b", "kappa", "k", "sa_iterations", "seed")}
    preset = preset.with_schedule(**{k: v for k, v in sched.items() if v is not None})
    if args.seed is not None:
        preset = replace(preset, seed=args.seed)
    profile = preset.profile
    if args.train_seconds is not None:
        profile = replace(profile, train=TrainModel(per_step_seconds=args.train_seconds))
    if args.noise_cv is not None:
        profile = replace(profile, noise_cv=args.noise_cv)
    preset = replace(preset, profile=profile)
    if args.trace is not None or args.train_seconds is not None:
        # The reference T_gen belongs to the preset's own workload and trainer, not to overrides.
        preset = replace(preset, reference=ReferenceTimings())
    if args.global_batch is not None:
        preset = replace(
            preset, runtime={**preset.runtime, "num_prompts_per_global_batch": args.global_batch}
        )
    return with_cluster(
        preset, num_generation_units=args.num_generation_units, actors_per_gu=args.actors_per_gu
    )


def render(report: ConditionsReport, preset: SimPreset) -> str:
    lines = [
        f"preset {report.preset}: {preset.cluster.num_generation_units} GU x {preset.cluster.actors_per_gu} actors, "
        f"b={preset.schedule.b} kappa={preset.schedule.kappa} k={preset.schedule.k}",
        f"workload {report.workload}; noisy-oracle tau {report.measured_tau:.3f}",
    ]
    if preset.reference.t_gen_seconds is not None:
        const = eq4_constant(preset.profile, preset.reference.t_gen_seconds)
        lines.append(f"Eq. 4 from the reference timings: d_off ~ Q_arrival + {const:.2f}")
    lines += ["", format_table(report.rows()), ""]
    for name, r in report.results.items():
        lag = r.lag
        eq4 = "n/a" if lag.d_off_eq4 is None else f"{lag.d_off_eq4:.2f}"
        measured = "n/a" if lag.d_off_measured_mean is None else f"{lag.d_off_measured_mean:.2f}"
        duty = "n/a" if r.duty_cycle is None else f"{r.duty_cycle:.3f}"
        lines.append(
            f"{name}: T_gen {r.mean_gen_seconds:.1f}s (STD {r.std_gen_seconds:.1f}) | d_off measured {measured} "
            f"(max {lag.d_off_measured_max}) vs Eq. 4 {eq4} at Q_arrival {lag.q_arrival_mean_global_batches:.2f} "
            f"| duty cycle {duty} | paused {r.summary.seconds_paused:.0f}s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    preset = preset_from_args(args)
    workload = preset.load_workload()
    if args.compare_online or args.length_drift:
        return _compare_online(args, preset, workload)
    report = simulate_conditions(
        preset,
        workload,
        args.conditions,
        skip_first=args.skip_first,
        check_invariants=args.check_invariants,
    )
    print(render(report, preset))
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report.to_dict(include_series=args.series), indent=2))
        print(f"wrote {out}")
    return 0


def _compare_online(args: argparse.Namespace, preset: SimPreset, workload: Workload) -> int:
    from mindspeed_rl.sim.drift import DRIFTS
    from mindspeed_rl.sim.online import OnlineSettings, compare_online

    if not args.compare_online:
        raise SystemExit("--length-drift applies to --compare-online; add --compare-online.")
    drifts = [d for d in args.length_drift.split(",") if d]
    unknown = sorted(set(drifts) - set(DRIFTS))
    if unknown or args.seeds < 1:
        raise SystemExit(f"unknown drift(s) {unknown} (choose from {DRIFTS}) or --seeds < 1.")
    settings = OnlineSettings(refit_interval=args.refit_interval, replan_interval=args.replan_interval)
    report = compare_online(
        preset, workload, drifts, range(args.seeds), settings=settings, with_bound=args.online_bound
    )
    lines = [
        "| drift | schedule | group CV (epoch 1 / epoch 2) | CV / offline | iteration (s) | iteration / offline |"
    ]
    lines.append("|---|---|---|---|---|---|")
    for a in report["aggregate"]:
        for schedule in ("offline", "online", "bound"):
            if schedule not in a:
                continue
            m, off = a[schedule], a["offline"]
            lines.append(
                f"| {a['drift']} | {schedule} | {m['group_cv_mean']:.4f} ({m['group_cv_epoch0']:.4f} / "
                f"{m['group_cv_epoch1']:.4f}) | {m['group_cv_mean'] / off['group_cv_mean']:.2f} | "
                f"{m['iteration_s_mean']:.1f} | {m['iteration_s_mean'] / off['iteration_s_mean']:.3f} |"
            )
    print("\n".join(lines))
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
