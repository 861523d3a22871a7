"""C4 offline vs C4 online under length drift, by trace replay on the real async pipeline.

    python benchmarks/replay_drift.py --backend vllm --iters 32 --global-batch 8 --b 8 --k 2 \\
        --step-seconds 0.3 --max-tokens 384 --drifts none,hetero2x,noise2x --json runs/replay_drift.json

Two epochs of the AIME length trace's first ``iters x global_batch`` prompts (``--trace`` for
another), each sample forced to the drift model's length at the weights generating it
(``mindspeed_rl/sim/drift_replay.py``); a fixed-sleep trainer step. Per drift model and seed,
the same C4 schedule runs offline and with ``asp_config.online=true``. Writes, per run, the
simulator's comparison fields (``group_cv_mean``, ``iteration_s_mean``) read from the run's
``events.jsonl``. Flags not listed here are ``cli/replay_trace.py``'s.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli import replay_trace

AIME = Path(__file__).resolve().parents[2] / "shared" / "data" / "eval" / "aime_r1distill_1p5b_lengths.jsonl"
CV_BLOCK = 8


def _parser() -> Any:
    p = replay_trace._parser()
    p.add_argument("--drifts", default="none,hetero2x,noise2x", help="comma-separated drift models")
    p.add_argument("--seeds", type=int, default=1, help="seeds first..first+N-1")
    p.add_argument("--first-seed", type=int, default=0, help="the first seed (add seeds to an earlier run)")
    p.add_argument("--max-tokens", type=int, default=384, help="engine response cap (drift's max_tokens)")
    p.set_defaults(trace=str(AIME) if AIME.is_file() else None, run_dir="runs/replay_drift")
    for action in p._actions:
        if action.dest == "trace":
            action.required = not AIME.is_file()
    return p


def run_one(args: Any, drift: str, seed: int, online: bool) -> dict[str, Any]:
    from dataclasses import replace

    from asp_scheduler.params import ScheduleParams
    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.sim.drift import DriftParams, two_epochs
    from mindspeed_rl.sim.drift_replay import build_drift_plan, group_cv_from_events
    from mindspeed_rl.sim.replay import read_events
    from mindspeed_rl.sim.table4b import table4b_row
    from mindspeed_rl.trainer.async_inputs import PipelineInputs
    from mindspeed_rl.trainer.grpo_trainer_async import train

    base = replay_trace.sized_workload(args)
    name = f"{drift}_s{seed}_{'online' if online else 'offline'}"
    run_dir = Path(args.run_dir).resolve() / name
    run_dir.mkdir(parents=True, exist_ok=False)
    limit = args.max_tokens
    drift_params = replace(DriftParams(), max_tokens=limit)
    two = two_epochs(base, seed=seed, resample_sigma=drift_params.resample_sigma)  # sizes the config
    overrides = [
        *replay_trace.config_overrides(args, two, run_dir),
        f"generate_config.sampling_config.max_tokens={limit}",
        f"generate_config.max_model_len={limit + 16}",
        f"asp_config.online={str(online).lower()}",
    ]
    config = load_config_from_files(replay_trace.REPO_CONFIGS, args.config_name, overrides)
    params = ScheduleParams(b=args.b, kappa=args.kappa, k=args.k, sa_iterations=args.sa_iterations, seed=seed)
    plan = build_drift_plan(
        base,
        params,
        drift=drift,
        tau=args.tau,
        global_batch=args.global_batch,
        drift_params=drift_params,
        prompt_tokens=replay_trace.PROMPT_TOKENS,
        vocab_size=replay_trace._vocab_size(config),
    )
    inputs = PipelineInputs(
        prompts=plan.prompts,
        schedule=plan.schedule,
        forced_lengths=plan.lengths,
        simulated_step_seconds=args.step_seconds,
        predictions=plan.predictions if online else None,
    )
    train(config, run_dir, inputs)
    replay_trace._wait_for_released_cpus()
    events = read_events(run_dir / "events.jsonl")
    row = table4b_row(events, condition=name, skip_first=args.skip_first)
    cv = group_cv_from_events(events, k=args.k, block=CV_BLOCK)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "schedule": "online" if online else "offline",
        "drift": drift,
        "seed": seed,
        "group_cv_mean": cv["measured"],
        "group_cv_predicted_mean": float("nan"),  # plan-time loads are not in the event log
        "num_full_groups": cv["num_groups"],
        "iteration_s_mean": row.mean_iteration_seconds,
        "num_iterations": row.num_iterations,
        "total_s": row.total_seconds,
        "oracle_tau": plan.measured_tau,
        "prompts_consumed": summary["prompts_consumed"],
        "prompts_consumed_unique": summary.get("prompts_consumed_unique_total"),
        "schedule_replans": summary.get("schedule_replans", 0),
        "replan_wall_s_mean": summary.get("replan_wall_s_mean"),
        "run_dir": str(run_dir),
    }


def main(argv: list[str] | None = None) -> int:
    from mindspeed_rl.sim.online import aggregate
    from mindspeed_rl.utils.ray_setup import init_ray

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    args = _parser().parse_args(argv)
    drifts = [d.strip() for d in args.drifts.split(",") if d.strip()]
    root = Path(args.run_dir).resolve()
    if root.exists() and any(root.iterdir()):
        raise SystemExit(f"{root} already holds runs; pass a new --run-dir or move the old one away.")
    from mindspeed_rl.config_cls import load_config_from_files

    init_ray(load_config_from_files(replay_trace.REPO_CONFIGS, args.config_name, []))
    rows = []
    for drift in drifts:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for online in (False, True):
                rows.append(run_one(args, drift, seed, online))
                r = rows[-1]
                print(f"{r['drift']} seed {seed} {r['schedule']}: group CV {r['group_cv_mean']:.4f}, "
                      f"iteration {r['iteration_s_mean']:.3f} s, {r['schedule_replans']} re-plans", flush=True)  # fmt: skip
    report = {
        "settings": vars(args),
        "cv_block_groups": CV_BLOCK,
        "conditions": rows,
        "aggregate": aggregate(rows),
    }
    for agg in report["aggregate"]:
        print(f"{agg['drift']}: CV online/offline {agg['group_cv_ratio']:.3f}, "
              f"iteration online/offline {agg['iteration_ratio']:.3f}")  # fmt: skip
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=lambda x: float(x) if np.isscalar(x) else str(x)))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
