"""Calibrate the simulator's decode model.

    python -m mindspeed_rl.sim fit-decode --runs runs.jsonl [--no-overhead] [--json fit.json]
    python -m mindspeed_rl.sim measure-decode --out runs.jsonl [--model DIR] [--backend hf|vllm]

``fit-decode`` fits ``t_step(active) = a + b · active`` (and a per-minibatch overhead ``c``) from
timed fixed-length decodes (see ``mindspeed_rl.sim.fit`` for the row format) and prints the
``profile.decode`` block of a preset. ``measure-decode`` produces such a file by timing a real
rollout engine — by default the tiny Qwen3 model on this CPU (created in a temporary folder when
``--model`` is not given) — and fits it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from mindspeed_rl.sim.fit import DecodeFit, fit_decode, read_runs, write_runs


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mindspeed_rl.sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit-decode", help="fit the decode model from a JSONL of timed runs")
    fit.add_argument("--runs", required=True, help="JSONL: batch_size, num_steps (or num_tokens), seconds")
    fit.add_argument("--no-overhead", action="store_true", help="force the per-minibatch overhead c to 0")
    fit.add_argument("--json", default=None, help="also write the fit here")
    meas = sub.add_parser("measure-decode", help="time fixed-length decodes on a real engine, then fit")
    meas.add_argument("--out", required=True, help="where to write the timed runs (JSONL)")
    meas.add_argument("--model", default=None, help="HF model folder (default: a fresh tiny Qwen3)")
    meas.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    meas.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    meas.add_argument("--steps", type=int, nargs="+", default=[16, 64])
    meas.add_argument("--repeats", type=int, default=1)
    meas.add_argument("--json", default=None, help="also write the fit here")
    return p


def _report(fit: DecodeFit, json_path: str | None) -> None:
    m = fit.model
    print(f"fit over {fit.num_runs} runs: R^2 {fit.r2:.4f}, max relative error {fit.max_relative_error:.1%}")
    print("profile:\n  decode:")
    print(f"    per_step_seconds: {m.per_step_seconds:.6g}       # a")
    print(f"    per_token_seconds: {m.per_token_seconds:.6g}      # b")
    print(f"    per_minibatch_seconds: {m.per_minibatch_seconds:.6g}  # c")
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(fit.to_dict(), indent=2))
        print(f"wrote {json_path}")


def _measure(args: argparse.Namespace) -> DecodeFit:
    from mindspeed_rl.sim.measure import measure_decode_runs, tiny_arch

    with tempfile.TemporaryDirectory(prefix="sim_decode_") as tmp:
        model = args.model
        if model is None:
            from mindspeed_rl.models.tiny import create_tiny_model

            model = str(create_tiny_model(Path(tmp) / "tiny", tiny_arch()))
        runs = measure_decode_runs(
            model, backend=args.backend, batch_sizes=args.batch_sizes, steps=args.steps, repeats=args.repeats
        )
    write_runs(args.out, runs)
    for r in runs:
        print(f"batch {r.batch_size:4d}  steps {r.num_steps:6.0f}  {r.seconds:.4f}s")
    print(f"wrote {args.out}")
    return fit_decode(runs)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "fit-decode":
        fit = fit_decode(read_runs(args.runs), fit_overhead=not args.no_overhead)
    else:
        fit = _measure(args)
    _report(fit, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
