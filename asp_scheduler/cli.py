"""``python -m asp_scheduler {demo,schedule,ablate,bench}``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from asp_scheduler.params import ScheduleParams


def _add_schedule_params(p: argparse.ArgumentParser) -> None:
    p.add_argument("--b", type=int, default=32, help="base minibatch size (prompts)")
    p.add_argument("--kappa", type=int, default=2, help="allowed minibatch size variation")
    p.add_argument("--k", type=int, default=6, help="minibatches per batch group")
    p.add_argument("--sa-iterations", type=int, default=2_000_000)
    p.add_argument("--sa-constant", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)


def _params(args: argparse.Namespace, **extra: Any) -> ScheduleParams:
    from asp_scheduler.params import ScheduleParams

    return ScheduleParams(
        b=args.b, kappa=args.kappa, k=args.k, sa_iterations=args.sa_iterations,
        sa_constant=args.sa_constant, seed=args.seed, **extra,
    )  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asp_scheduler", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="schedule a bundled synthetic dataset and print C0 vs ASP")
    demo.add_argument("--out", default="runs/demo_schedule.json")
    demo.add_argument("--num-prompts", type=int, default=4000)
    demo.add_argument("--tau", type=float, default=0.64)
    _add_schedule_params(demo)
    sched = sub.add_parser("schedule", help="build a schedule from prompts and a predictions file")
    sched.add_argument("--prompts", required=True)
    sched.add_argument("--predictions", required=True)
    sched.add_argument("--out", required=True)
    sched.add_argument("--id-field", default="prompt_id")
    sched.add_argument("--prediction-field", default="predicted_length")
    sched.add_argument("--shuffle-groups", action="store_true")
    _add_schedule_params(sched)
    abl = sub.add_parser("ablate", help="C0-C4 ablation on measured lengths with a tau-controlled oracle")
    abl.add_argument("--lengths", required=True)
    abl.add_argument("--field", default="response_tokens")
    abl.add_argument("--tau", type=float, action="append", required=True)
    abl.add_argument("--seeds", type=int, default=3)
    abl.add_argument("--calibrate", action="store_true", help="also run C4_calibrated")
    abl.add_argument(
        "--calibration-fraction", type=float, default=0.2, help="share of items profiled for calibration"
    )
    abl.add_argument("--json", required=True)
    abl.add_argument("--markdown")
    _add_schedule_params(abl)
    bench = sub.add_parser("bench", help="SA throughput, 10^7-item schedule time, Table 6")
    bench.add_argument("--json", required=True)
    return parser


def _write_json(path: str, doc: object) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2))


def _demo(args: argparse.Namespace) -> None:
    from asp_scheduler.calibration import IsotonicCalibrator, profiled_indices
    from asp_scheduler.metrics import schedule_metrics
    from asp_scheduler.minibatch import fixed_size_endpoints
    from asp_scheduler.predictors import NoisyOraclePredictor, evaluate_predictor
    from asp_scheduler.schedule import build_schedule
    from asp_scheduler.synthetic import synthetic_prompts

    data = synthetic_prompts(args.num_prompts, seed=args.seed)
    oracle = NoisyOraclePredictor(target_tau=args.tau, seed=args.seed).fit(data.prompts, data.lengths)
    pred = oracle.predict(data.prompts)
    quality = evaluate_predictor(pred, data.lengths)
    params = _params(args)
    schedule = build_schedule(
        pred,
        params,
        item_ids=[p.prompt_id for p in data.prompts],
        predictor={"name": oracle.name, "target_tau": args.tau, "seed": args.seed},
        predictor_quality=quality,
    )
    schedule.save(args.out)
    profiled = profiled_indices(pred.size, params.calibration_fraction, params.seed)
    calibrator = IsotonicCalibrator.fit(pred[profiled], data.lengths[profiled])
    calibrated = build_schedule(
        pred, _params(args, calibrate_loads=True), calibrated_lengths=calibrator.transform(pred)
    )
    c0 = np.split(np.arange(data.lengths.size), fixed_size_endpoints(data.lengths.size, args.b)[1:-1])
    rows = {"C0 (file order)": schedule_metrics(data.lengths, c0, args.k)}
    rows["ASP"] = schedule_metrics(data.lengths, schedule.minibatches, args.k)
    rows["ASP+calibrated"] = schedule_metrics(data.lengths, calibrated.minibatches, args.k)
    print(
        f"{data.lengths.size} synthetic prompts; predictor tau={quality.kendall_tau:.3f} MAE={quality.mae_tokens:.0f}"
    )
    print("metrics on measured lengths:")
    print(f"{'condition':<16}{'dispersion':>12}{'padding':>10}{'group CV':>10}{'spread':>9}")
    for name, m in rows.items():
        print(f"{name:<16}{m.dispersion:>12.0f}{m.padding:>10.3f}{m.group_cv:>10.3f}{m.group_spread:>9.2f}")
    print("(ASP+calibrated balances on isotonic-calibrated loads fitted on 20% profiled prompts; not saved)")
    print(f"wrote {len(schedule.minibatches)} minibatches (ASP) to {args.out}")


def _schedule(args: argparse.Namespace) -> None:
    from asp_scheduler.jsonl import read_prompts
    from asp_scheduler.predictors.from_file import FilePredictor
    from asp_scheduler.schedule import build_schedule

    prompts = read_prompts(args.prompts, id_field=args.id_field)
    predictor = FilePredictor(args.predictions, id_field=args.id_field, length_field=args.prediction_field)
    pred = predictor.predict(prompts)
    schedule = build_schedule(
        pred,
        _params(args, shuffle_groups=args.shuffle_groups),
        item_ids=[p.prompt_id for p in prompts],
        predictor={"name": predictor.name, "path": str(args.predictions)},
    )
    schedule.save(args.out)
    m = schedule.predicted_metrics
    print(
        f"{len(schedule.minibatches)} minibatches ({schedule.num_short_minibatches} short); predicted padding "
        f"{m.padding:.3f}, group CV {m.group_cv:.3f}; wrote {args.out}"
    )


def _ablate(args: argparse.Namespace) -> None:
    from asp_scheduler.ablation import run_ablation, to_markdown
    from asp_scheduler.jsonl import read_lengths

    lengths = read_lengths(args.lengths, args.field)
    params = _params(args, calibrate_loads=args.calibrate, calibration_fraction=args.calibration_fraction)
    report = run_ablation(lengths, args.tau, args.seeds, params)
    _write_json(args.json, report)
    table = to_markdown(report)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(table)
    print(table)


def _bench(args: argparse.Namespace) -> None:
    from asp_scheduler.bench import run_bench

    result = run_bench()
    _write_json(args.json, result)
    print(json.dumps({k: v for k, v in result.items() if k != "table6"}, indent=2))
    for dist, cells in result["table6"].items():  # type: ignore[attr-defined]
        print(dist, " ".join(f"{c['variance_reduction_pct']:.1f} (paper {c['paper_pct']})" for c in cells))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"demo": _demo, "schedule": _schedule, "ablate": _ablate, "bench": _bench}
    try:
        handlers[args.command](args)
    except ValueError as err:
        print(f"error: {err}")
        return 2
    return 0
