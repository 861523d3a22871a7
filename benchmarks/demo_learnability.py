"""Does GRPO raise the demo task's reward on CPU within minutes?

Creates the tiny model, runs the SFT warm-up on demo pairs, then GRPO iterations with the torch
training engine and plain HF ``generate`` sampling (temperature 1, full distribution), printing the
reward per iteration and writing a JSON summary::

    .venv/bin/python benchmarks/demo_learnability.py --json runs/demo_learnability.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mindspeed_rl.datasets.demo_task import (
    MAX_RESPONSE_CHARS,
    demo_reward,
    demo_sft_pairs,
    generate_demo_prompts,
)
from mindspeed_rl.models.loss import GRPOLossConfig, group_norm_advantages
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, build_char_tokenizer, create_tiny_model
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.reference import ReferenceModel
from mindspeed_rl.models.training.sft_warmup import sft_warmup
from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, required=True, help="where to write the summary")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hidden-size", type=int, default=TINY_TEST_ARCH["hidden_size"])
    p.add_argument("--num-layers", type=int, default=TINY_TEST_ARCH["num_layers"])
    p.add_argument("--sft-steps", type=int, default=1200)
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument("--sft-batch-size", type=int, default=32)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--prompts-per-iteration", type=int, default=16)
    p.add_argument("--n-samples", type=int, default=8)
    p.add_argument("--mini-batch-size", type=int, default=2, help="prompts per optimizer step")
    p.add_argument("--epochs", type=int, default=2, help="passes over each global batch")
    p.add_argument("--micro-batch-size", type=int, default=32, help="samples per forward/backward")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--kl-coef", type=float, default=0.001)
    p.add_argument("--clip-ratio", type=float, default=0.2)
    p.add_argument("--entropy-coeff", type=float, default=0.0)
    p.add_argument(
        "--model-dir", type=Path, default=None, help="reuse a warmed model here (created on first use)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for this model size)")
    p.add_argument("--max-new-tokens", type=int, default=MAX_RESPONSE_CHARS + 8)
    return p.parse_args()


def model_arch(args: argparse.Namespace) -> dict[str, Any]:
    arch = dict(TINY_TEST_ARCH)
    arch.update(
        hidden_size=args.hidden_size, num_layers=args.num_layers, ffn_hidden_size=2 * args.hidden_size
    )
    arch["kv_channels"] = args.hidden_size // arch["num_attention_heads"]
    return arch


@torch.no_grad()
def sample(model: Any, tokenizer: Any, prompts: list[str], n: int, max_new: int) -> list[list[int]]:
    """n samples per prompt (grouped), each cut after its first eos (eos kept: stopping is learned)."""
    tokenizer.padding_side = "left"
    enc = tokenizer(
        [p for p in prompts for _ in range(n)], return_tensors="pt", padding=True, add_special_tokens=False
    )
    model.eval()
    out = model.generate(
        **enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    responses = []
    for row in out[:, enc["input_ids"].shape[1] :].tolist():
        cut = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        responses.append(row[:cut])
    return responses


def grpo_iteration(
    engine: TorchTrainingEngine,
    ref: ReferenceModel,
    tokenizer: Any,
    items: list[dict[str, str]],
    args: argparse.Namespace,
) -> dict[str, float]:
    t0 = time.perf_counter()
    prompts = [it["prompt"] for it in items]
    responses = sample(engine.model, tokenizer, prompts, args.n_samples, args.max_new_tokens)
    t_gen = time.perf_counter() - t0
    answers = [it["answer"] for it in items for _ in range(args.n_samples)]
    rewards = np.array(
        [demo_reward(tokenizer.decode(r, skip_special_tokens=True), a) for r, a in zip(responses, answers)]
    )
    adv = group_norm_advantages(torch.from_numpy(rewards), args.n_samples).numpy()
    prompt_ids = [
        tokenizer.encode(p, add_special_tokens=False) for p in prompts for _ in range(args.n_samples)
    ]
    batch = TrainBatch.from_lists(prompt_ids=prompt_ids, response_ids=responses, advantages=adv)
    batch = batch.with_log_probs(
        old=engine.compute_log_probs(batch, 1.0), ref=ref.compute_log_probs(batch, 1.0)
    )
    t1 = time.perf_counter()
    metrics = engine.update(batch, 1.0)
    lengths = [len(r) for r in responses]
    return {
        "reward_mean": float(rewards.mean()),
        "exact_frac": float((rewards == 1.0).mean()),
        "response_length_mean": float(np.mean(lengths)),
        "response_length_max": float(max(lengths)),
        "gen_s": t_gen,
        "train_s": time.perf_counter() - t1,
        **{k: metrics[k] for k in ("loss", "kl", "entropy", "clip_frac", "grad_norm")},
    }


def warmed_model(args: argparse.Namespace, tokenizer: Any, tmp: Path) -> tuple[Path, dict[str, float]]:
    """Create + SFT a model, or reuse the one in ``--model-dir`` (handy when tuning GRPO only)."""
    marker = args.model_dir / "warmup.json" if args.model_dir else None
    if marker is not None and marker.exists():
        return args.model_dir, json.loads(marker.read_text())
    path = create_tiny_model(args.model_dir or tmp, model_arch(args), seed=args.seed)
    pairs = demo_sft_pairs(min(20_000, args.sft_steps * args.sft_batch_size), args.seed)
    warm = sft_warmup(
        path,
        tokenizer,
        pairs,
        steps=args.sft_steps,
        lr=args.sft_lr,
        batch_size=args.sft_batch_size,
        seed=args.seed,
    )
    if marker is not None:
        marker.write_text(json.dumps(warm))
    return path, warm


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = build_char_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        path, warm = warmed_model(args, tokenizer, Path(tmp) / "model")
        print(f"warm-up: {json.dumps(warm)}", flush=True)
        cfg = TorchEngineConfig(
            lr=args.lr, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.99, clip_grad=1.0,
            micro_batch_size=args.micro_batch_size, forward_micro_batch_size=64,
            mini_batch_size=args.mini_batch_size, epochs=args.epochs, n_samples_per_prompt=args.n_samples, seed=args.seed,
            loss=GRPOLossConfig(clip_ratio=args.clip_ratio, kl_penalty="low_var_kl", init_kl_coef=args.kl_coef, entropy_coeff=args.entropy_coeff),
        )  # fmt: skip
        engine = TorchTrainingEngine(path, cfg)
        ref = ReferenceModel(path, micro_batch_size=64)
        items = generate_demo_prompts(args.iterations * args.prompts_per_iteration, args.seed)
        rows = []
        for it in range(args.iterations):
            chunk = items[it * args.prompts_per_iteration : (it + 1) * args.prompts_per_iteration]
            row = {"iteration": it, **grpo_iteration(engine, ref, tokenizer, chunk, args)}
            rows.append(row)
            print(
                " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                flush=True,
            )
    rewards = [r["reward_mean"] for r in rows]
    summary = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "arch": model_arch(args),
        "warmup": warm,
        "iterations": rows,
        "reward_first5": float(np.mean(rewards[:5])),
        "reward_last5": float(np.mean(rewards[-5:])),
        "iteration_s_mean": float(np.mean([r["gen_s"] + r["train_s"] for r in rows])),
    }
    print(f"reward first5={summary['reward_first5']:.3f} last5={summary['reward_last5']:.3f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
