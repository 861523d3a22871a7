"""Replay the minibatches of finished replay conditions on one engine, alone, and compare.

A trace replay times every minibatch inside the pipeline, where two engines, the control
processes and the trainer share the host. This re-decodes the same minibatches (the forced lengths
in each condition's ``replay_plan.json``) on a single engine in this process, with nothing else
running. Conditions are interleaved minibatch by minibatch, alternating which goes first, so
drift in the host's speed falls on all of them alike. It then fits the decode model to the
isolated timings and prints, per condition, the mean minibatch time alone and in the pipeline,
each against that model::

    .venv/bin/python benchmarks/decode_in_isolation.py runs/replay_b8_lp_r1/C0 runs/replay_b8_lp_r1/C4 \
        --json runs/decode_in_isolation.json

A condition whose pipeline residual is much larger than its isolated one is slowed by the
pipeline (contention, scheduling), not by its lengths.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from mindspeed_rl.sim.calibrate import read_run_timings
from mindspeed_rl.sim.fit import DecodeRun, fit_decode
from mindspeed_rl.sim.replay import read_plan_lengths


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", nargs="+", type=Path, help="replay condition directories (runs/<replay>/<C>)")
    p.add_argument("--model-dir", default="runs/models/tiny_qwen3", help="the policy the replay used")
    p.add_argument("--backend", default="vllm", choices=("vllm", "hf"))
    p.add_argument("--threads", type=int, default=1, help="engine threads (the replay's actors used 1)")
    p.add_argument("--prompt-tokens", type=int, default=4, help="prompt length the replay used")
    p.add_argument("--max-model-len", type=int, default=192)
    p.add_argument("--json", type=Path, help="write the results here (also printed)")
    return p.parse_args()


def _conditions(run_dirs: list[Path]) -> dict[str, list[np.ndarray]]:
    names = [d.name for d in run_dirs]
    if len(set(names)) != len(names):
        raise ValueError(f"condition directory names must differ (got {names}); pass one run's conditions.")
    out = {}
    for d in run_dirs:
        lengths = read_plan_lengths(d)
        out[d.name] = [lengths[i] for i in sorted(lengths)]
    return out


def _interleaved(plans: dict[str, list[np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """Minibatch i of every condition, conditions rotated by i so none always goes first."""
    names = list(plans)
    order = []
    for i in range(max(len(v) for v in plans.values())):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            if i < len(plans[name]):
                order.append((name, plans[name][i]))
    return order


def _time_isolated(
    args: argparse.Namespace, work: list[tuple[str, np.ndarray]]
) -> list[tuple[str, DecodeRun]]:
    from mindspeed_rl.models.rollout import SamplingConfig, build_rollout_engine

    longest = max(int(lengths.max()) for _, lengths in work)
    if args.prompt_tokens + longest > args.max_model_len:
        raise ValueError(
            f"--max-model-len {args.max_model_len} < prompt + longest response ({args.prompt_tokens + longest})."
        )
    widest = max(lengths.size for _, lengths in work)
    engine_keys = {
        "max_model_len": args.max_model_len,
        "max_num_seqs": widest,
        "dtype": "float32",
        "num_threads": args.threads,
    }
    engine = build_rollout_engine(args.backend, args.model_dir, engine_keys, seed=0)
    # min_tokens is capped per request at its own limit, so each sample decodes exactly its length.
    sampling = SamplingConfig(
        max_tokens=longest, min_tokens=longest, ignore_eos=True, temperature=1.0, seed=0
    )
    prompt = [5 + i for i in range(args.prompt_tokens)]

    def decode(lengths: np.ndarray) -> float:
        limits = [int(x) for x in lengths]
        tic = time.perf_counter()
        out = engine.generate([prompt] * len(limits), sampling, n=1, max_tokens_per_prompt=limits)
        seconds = time.perf_counter() - tic
        got = [len(group[0].token_ids) for group in out]
        if got != limits:
            raise RuntimeError(f"the engine did not decode the forced lengths: {got[:4]} vs {limits[:4]}")
        return seconds

    try:
        decode(work[0][1])  # warm-up, untimed
        timed = []
        for name, lengths in work:
            seconds = decode(lengths)
            timed.append(
                (name, DecodeRun(batch_size=int(lengths.size), num_steps=float(lengths.max()),
                                 seconds=seconds, sum_tokens=float(lengths.sum())))
            )  # fmt: skip
        return timed
    finally:
        engine.shutdown()


def main() -> int:
    args = parse_args()  # the vLLM engine sets its CPU environment itself, as in the actors
    plans = _conditions(args.run_dirs)
    isolated = _time_isolated(args, _interleaved(plans))
    fit = fit_decode([run for _, run in isolated], relative=False)
    model = fit.model

    def predicted(run: DecodeRun) -> float:
        return (
            model.per_minibatch_seconds
            + model.per_step_seconds * run.num_steps
            + model.per_token_seconds * run.tokens
        )

    rows: dict[str, Any] = {}
    for d in args.run_dirs:
        alone = [run for name, run in isolated if name == d.name]
        in_pipeline = read_run_timings(d).decode_runs
        rows[d.name] = {
            "minibatches": len(alone),
            "isolated_mean_s": statistics.fmean(r.seconds for r in alone),
            "isolated_model_mean_s": statistics.fmean(predicted(r) for r in alone),
            "pipeline_mean_s": statistics.fmean(r.seconds for r in in_pipeline),
            "pipeline_model_mean_s": statistics.fmean(predicted(r) for r in in_pipeline),
        }
    print(f"decode model fitted alone: {model} (R^2 {fit.r2:.3f})")
    print("| condition | alone: measured / model (s) | in the pipeline: measured / model (s) |")
    print("|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['isolated_mean_s']:.3f} / {r['isolated_model_mean_s']:.3f} "
              f"| {r['pipeline_mean_s']:.3f} / {r['pipeline_model_mean_s']:.3f} |")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"run_dirs": [str(d) for d in args.run_dirs], "model": fit.to_dict(), "conditions": rows,
                  "isolated": [{"condition": n, "seconds": r.seconds, "longest": r.num_steps, "tokens": r.tokens}
                               for n, r in isolated]}  # fmt: skip
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
