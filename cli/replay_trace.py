"""Replay a response-length trace on the real async pipeline for C0–C4 and print Table 4b's columns.

    python cli/replay_trace.py --trace lengths.jsonl --tau 0.6 --scale 0.01 \\
        --conditions C0,C1,C2,C3,C4 --iters 8 --json replay.json

Per condition: the tiny config (``grpo_tiny_asp`` plus overrides) runs with every sample's length
forced to its scaled trace length (EOS ignored, clipped to the engine's limit), predictions from
the τ-controlled noisy oracle, and a fixed sleep in place of each trainer step; the Training
Queue, backpressure and snapshot export/convert/reload are the real ones. Columns come from the
run's ``events.jsonl`` via ``mindspeed_rl.sim.table4b`` (the simulator's definitions).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asp_scheduler.params import ScheduleParams
from mindspeed_rl.sim.conditions import CONDITIONS
from mindspeed_rl.sim.replay import ReplayPlan, ReplayPlans, build_replay_plans, read_events, write_plan
from mindspeed_rl.sim.table4b import Table4bRow, format_table, table4b_row
from mindspeed_rl.sim.workload import Workload, load_trace

if TYPE_CHECKING:
    from mindspeed_rl.trainer.async_inputs import PipelineInputs

REPO_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PROMPT_TOKENS = 4


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", required=True, help="JSONL, one row per response (prompt_id, response_tokens)")
    p.add_argument("--tau", type=float, default=0.6, help="noisy-oracle Kendall tau")
    p.add_argument("--scale", type=float, default=0.01, help="multiply trace lengths by this")
    p.add_argument("--conditions", default=",".join(CONDITIONS), help="comma-separated, e.g. C0,C4")
    p.add_argument("--iters", type=int, default=None, help="global batches per condition (default: all)")
    p.add_argument("--global-batch", type=int, default=8, help="prompts per trainer step")
    p.add_argument("--b", type=int, default=2, help="base minibatch size in prompts")
    p.add_argument("--kappa", type=int, default=1)
    p.add_argument("--k", type=int, default=2, help="batch-group size in minibatches")
    p.add_argument("--sa-iterations", type=int, default=20_000)
    p.add_argument("--step-seconds", type=float, default=1.0, help="simulated trainer step (s)")
    p.add_argument("--seed", type=int, default=0, help="seed of predictions and SA")
    p.add_argument("--rows-as-prompts", action="store_true", help="each trace row is a prompt (n = 1)")
    p.add_argument("--length-field", default="response_tokens")
    p.add_argument("--id-field", default="prompt_id")
    p.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="rollout engine")
    p.add_argument("--config-name", default="grpo_tiny_asp")
    p.add_argument("--run-dir", default="runs/replay", help="one sub-folder per condition")
    p.add_argument("--skip-first", type=int, default=0, help="warm-up iterations left out of mean/trend")
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument(
        "overrides", nargs="*", help="extra config overrides, e.g. async_config.queue_max_samples=64"
    )
    return p


def sized_workload(args: argparse.Namespace) -> Workload:
    workload = load_trace(
        args.trace,
        scale=args.scale,
        group_by_prompt=not args.rows_as_prompts,
        length_field=args.length_field,
        id_field=args.id_field,
    )
    available = workload.num_prompts // args.global_batch
    iters = available if args.iters is None else args.iters
    if not 1 <= iters <= available:
        raise ValueError(
            f"--iters {iters}: the trace has {workload.num_prompts} prompts = {available} global batches of "
            f"{args.global_batch}; pass --iters between 1 and {available} or a smaller --global-batch."
        )
    return workload.head(iters * args.global_batch)


def config_overrides(args: argparse.Namespace, workload: Workload, run_dir: Path) -> list[str]:
    gbs = args.global_batch
    samples = gbs * workload.num_samples_per_prompt  # micro-batch sizes only need to divide a batch
    return [
        f"run_dir={run_dir}",
        f"megatron_training.train_iters={workload.num_prompts // gbs}",
        f"megatron_training.global_batch_size={gbs}",
        f"rl_config.mini_batch_size={gbs}",
        f"rl_config.n_samples_per_prompt={workload.num_samples_per_prompt}",
        f"rl_config.rollout_backend={args.backend}",
        f"actor_config.micro_batch_size={samples}",
        f"rl_config.actor_forward_micro_batch_size={samples}",
        f"rl_config.ref_forward_micro_batch_size={samples}",
        "rl_config.init_kl_coef=0.0",  # no reference model: the step is simulated anyway
        "rl_config.use_tensorboard=false",
        "warmup_config.enabled=false",  # lengths are forced; the policy's skill is irrelevant
        "megatron_training.eval_interval=null",  # the trace's prompts have no held-out part
        "generate_config.sampling_config.max_tokens=160",  # the config's own cap, as measured
        f"asp_config.b={args.b}",
        f"asp_config.kappa={args.kappa}",
        f"asp_config.k={args.k}",
        *args.overrides,
    ]


def run_condition(config: Any, plans: ReplayPlans, name: str, root: Path, skip_first: int) -> dict[str, Any]:
    from mindspeed_rl.trainer.grpo_trainer_async import train
    from mindspeed_rl.utils.metrics import read_metrics

    run_dir = root / name
    run_dir.mkdir(parents=True, exist_ok=False)
    plan = plans.plans[name]
    write_plan(plan, run_dir)
    train(config, run_dir, condition_inputs(config, plan))
    _wait_for_released_cpus()
    row = table4b_row(read_events(run_dir / "events.jsonl"), condition=name, skip_first=skip_first)
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = read_metrics(run_dir / "metrics.jsonl")
    return {
        "row": row,
        "run_dir": str(run_dir),
        "prompts_scheduled": summary["prompts_scheduled"],
        "prompts_consumed": summary["prompts_consumed"],
        "response_tokens_expected": plan.total_response_tokens,
        "response_tokens_generated": int(sum(m["num_response_tokens"] for m in metrics)),
    }


def condition_inputs(config: Any, plan: ReplayPlan) -> PipelineInputs:
    """The async trainer's inputs for one replayed condition: its prompts, its order, forced
    lengths and a fixed-duration trainer step."""
    from mindspeed_rl.trainer.async_inputs import PipelineInputs

    expected = config.megatron_training.training.train_iters * config.num_prompts_per_global_batch
    if len(plan.prompts) != expected:
        raise ValueError(
            f"the replay schedules {len(plan.prompts)} prompts but train_iters x global batch is {expected}; "
            "set megatron_training.train_iters to the replay's number of global batches"
        )
    return PipelineInputs(
        prompts=plan.prompts,
        schedule=plan.schedule,
        forced_lengths=plan.forced_lengths,
        simulated_step_seconds=plan.step_seconds,
    )


def _vocab_size(config: Any) -> int:
    vocab = config.model.padded_vocab_size
    if vocab is None:
        raise ValueError(
            "the model architecture has no padded_vocab_size; set it so prompt ids fit the model."
        )
    return int(vocab)


def _wait_for_released_cpus(timeout_s: float = 60.0) -> None:
    """``train`` kills its actors asynchronously; the next condition needs their CPUs back."""
    import ray

    deadline = time.monotonic() + timeout_s
    total = ray.cluster_resources().get("CPU", 0.0)
    while ray.available_resources().get("CPU", 0.0) < total - 1e-6:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the previous condition's actors still hold CPUs after {timeout_s:.0f} s")
        time.sleep(0.2)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayInputs:
    """Everything a replay (or its simulated twin, ``cli/sim_vs_replay.py``) is built from."""

    workload: Workload
    """The trace's first ``iters x global_batch`` prompts, lengths as in the trace (unclipped)."""
    config: Any
    plans: ReplayPlans
    length_limit: int
    run_root: Path

    @property
    def replayed_workload(self) -> Workload:
        """The lengths the engine is forced to produce (clipped to its limit)."""
        return replace(self.workload, lengths=np.minimum(self.workload.lengths, self.length_limit))


def conditions_of(args: argparse.Namespace) -> list[str]:
    return [c.strip() for c in args.conditions.split(",") if c.strip()]


def replay_inputs(args: argparse.Namespace) -> ReplayInputs:
    from mindspeed_rl.config_cls import load_config_from_files

    workload = sized_workload(args)
    root = Path(args.run_dir).resolve()
    config = load_config_from_files(REPO_CONFIGS, args.config_name, config_overrides(args, workload, root))
    sampling = config.generate_config.sampling_config
    params = ScheduleParams(
        b=args.b, kappa=args.kappa, k=args.k, sa_iterations=args.sa_iterations, seed=args.seed
    )
    limit = min(sampling.max_tokens, config.generate_config.max_model_len - PROMPT_TOKENS)
    plans = build_replay_plans(
        workload,
        params,
        conditions_of(args),
        tau=args.tau,
        step_seconds=args.step_seconds,
        length_limit=limit,
        prompt_tokens=PROMPT_TOKENS,
        vocab_size=_vocab_size(config),
    )
    return ReplayInputs(workload=workload, config=config, plans=plans, length_limit=limit, run_root=root)


def replay(args: argparse.Namespace) -> dict[str, Any]:
    from mindspeed_rl.utils.ray_setup import init_ray

    inputs = replay_inputs(args)
    taken = [name for name in conditions_of(args) if (inputs.run_root / name).exists()]
    if taken:  # checked before any condition runs, so no replay is lost to a late failure
        raise ValueError(
            f"{inputs.run_root} already holds runs of {taken}; pass a new --run-dir or move the old one away."
        )
    init_ray(inputs.config)
    runs = {
        name: run_condition(inputs.config, inputs.plans, name, inputs.run_root, args.skip_first)
        for name in conditions_of(args)
    }
    plans = inputs.plans
    return {"workload": inputs.workload.source, "measured_tau": plans.measured_tau,
            "num_clipped_samples": plans.num_clipped_samples, "settings": vars(args), "runs": runs}  # fmt: skip


def to_json(report: dict[str, Any]) -> dict[str, Any]:
    runs = {name: {**r, "row": r["row"].to_dict()} for name, r in report["runs"].items()}
    return {**report, "runs": runs, "table4b": [r["row"] for r in runs.values()]}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    args = _parser().parse_args(argv)
    report = replay(args)
    rows: list[Table4bRow] = [r["row"] for r in report["runs"].values()]
    print(f"workload {report['workload']}; noisy-oracle tau {report['measured_tau']:.3f}; "
          f"{report['num_clipped_samples']} samples clipped to the engine limit")  # fmt: skip
    print(format_table(rows))
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(to_json(report), indent=2))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
