"""Multi-turn trajectories under the ASP schedule, in the simulator: C0 vs C4 on tokens vs C4 on cost.

    python benchmarks/multi_turn_sim.py [--preset configs/sim/qwen3_30b_a3b.yaml] [--json OUT]

The preset's workload (response tokens) gains tool use drawn from the distribution below; each
sample's work becomes its trajectory cost, ``tokens + tool seconds / a`` (``a``: the preset's
per-step decode seconds, i.e. one sequence's decode rate; ``mindspeed_rl/tools/trajectory_cost.py``),
which is what the simulated actors decode. Three dispatch orders on the same work:

* ``C0``: FIFO, no prediction;
* ``C4 tokens``: full ASP on a noisy oracle of each prompt's *token* count (a predictor blind to tools);
* ``C4 cost``: full ASP on a noisy oracle of each prompt's *trajectory cost* (what the online
  predictor learns in a multi-turn run), the same oracle quality tau.

Reported per condition: the simulated mean iteration time (Table 4b's, iteration 0 skipped) and the
group-load CV: the coefficient of variation, across batch groups, of each group's true decode time
(its minibatches' ``c + a * L_max + b * sum L`` summed), which ASP's SA balances.
``--token-scale`` shrinks the preset's response lengths (a model that writes shorter turns, where
tool time weighs more).

Tool-use distribution (documented, not measured on a model): each prompt has a tool propensity
``p ~ Beta(1, 2)``; each sample makes ``Binomial(MAX_CALLS, p)`` calls; a call takes
``LogNormal(log(CALL_MEDIAN_S), CALL_SIGMA)`` seconds clipped at ``CALL_TIMEOUT_S``: code execution
in a SandboxFusion-style sandbox, seconds typically, a heavy tail up to the timeout. The tool's
seconds also enter the ``b * sum L`` term (the simulator has no idle-wait state), which overstates
their cost by ``b / a`` (~1 %% with the default preset).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from mindspeed_rl.sim.conditions import build_condition_schedules
from mindspeed_rl.sim.preset import SimPreset
from mindspeed_rl.sim.runner import simulate_schedule
from mindspeed_rl.sim.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PRESET = ROOT / "configs" / "sim" / "qwen3_30b_a3b.yaml"
MAX_CALLS = 8
CALL_MEDIAN_S = 5.0
CALL_SIGMA = 1.2
CALL_TIMEOUT_S = 120.0


def tool_seconds(shape: tuple[int, int], seed: int) -> np.ndarray:
    """Per-sample tool seconds (prompts x samples) from the documented distribution."""
    rng = np.random.default_rng([seed, 37])
    propensity = rng.beta(1.0, 2.0, size=shape[0])
    calls = rng.binomial(MAX_CALLS, np.repeat(propensity[:, None], shape[1], axis=1))
    out = np.zeros(shape)
    for index in np.ndindex(shape):
        draws = rng.lognormal(np.log(CALL_MEDIAN_S), CALL_SIGMA, size=int(calls[index]))
        out[index] = float(np.minimum(draws, CALL_TIMEOUT_S).sum())
    return out


def group_load_cv(schedule: list, cost: dict[str, np.ndarray], a: float, b: float, c: float) -> float:
    groups: dict[int, float] = {}
    for mb in schedule:
        lengths = np.concatenate([cost[p] for p in mb.prompt_ids])
        groups[mb.batch_group_id] = (
            groups.get(mb.batch_group_id, 0.0) + c + a * lengths.max() + b * lengths.sum()
        )
    loads = np.array(list(groups.values()))
    return float(loads.std() / loads.mean())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default=str(DEFAULT_PRESET))
    p.add_argument("--sa-iterations", type=int, default=200_000)
    p.add_argument("--prompts", type=int, default=800)
    p.add_argument("--token-scale", type=float, default=1.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    t0 = time.perf_counter()
    preset = SimPreset.from_yaml(args.preset).with_schedule(sa_iterations=args.sa_iterations)
    base = preset.load_workload().head(args.prompts)
    scaled = np.maximum(1, np.rint(base.lengths * args.token_scale)).astype(np.int64)
    tokens = Workload(
        prompt_ids=base.prompt_ids, lengths=scaled, source=f"{base.source} x {args.token_scale}"
    )
    decode = preset.profile.decode
    a, b, c = decode.per_step_seconds, decode.per_token_seconds, decode.per_minibatch_seconds
    seconds = tool_seconds(tokens.lengths.shape, preset.seed)
    cost_lengths = np.rint(tokens.lengths + seconds / a).astype(np.int64)
    cost = Workload(prompt_ids=tokens.prompt_ids, lengths=cost_lengths, source=f"{tokens.source} + tools")
    by_prompt = dict(zip(cost.prompt_ids, cost.lengths))
    plans = {
        "C0": build_condition_schedules(cost, preset.schedule, ["C0"], tau=preset.tau).schedules["C0"],
        "C4 tokens": build_condition_schedules(tokens, preset.schedule, ["C4"], tau=preset.tau).schedules[
            "C4"
        ],
        "C4 cost": build_condition_schedules(cost, preset.schedule, ["C4"], tau=preset.tau).schedules["C4"],
    }
    rows = []
    for name, schedule in plans.items():
        result = simulate_schedule(replace(preset), cost, schedule, label=name)
        from mindspeed_rl.sim.table4b import table4b_row

        row = table4b_row(list(result.events), condition=name, start_time=0.0, skip_first=1)
        rows.append(
            {
                "condition": name,
                "mean_iteration_s": row.mean_iteration_seconds,
                "group_load_cv": group_load_cv(schedule, by_prompt, a, b, c),
                "mean_gen_s": result.mean_gen_seconds,
            }
        )
    share = float(seconds.sum() / a / cost_lengths.sum())
    print(
        f"{preset.name}: {args.prompts} prompts x {tokens.num_samples_per_prompt}, tokens x {args.token_scale}; tool time "
        f"{share:.1%} of the decode-equivalent work, mean {seconds.mean():.1f} s per sample"
    )
    print("| condition | mean iteration (s) | group-load CV | mean minibatch decode (s) |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['condition']} | {r['mean_iteration_s']:.1f} | {r['group_load_cv']:.3f} | {r['mean_gen_s']:.1f} |"
        )
    elapsed = time.perf_counter() - t0
    print(f"done in {elapsed:.1f}s")
    if args.json:
        out = {
            "preset": preset.name,
            "prompts": args.prompts,
            "token_scale": args.token_scale,
            "tool_share": share,
            "rows": rows,
            "seconds": elapsed,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
