"""Parity of the megatron-core engine (CPU, gloo, 2 processes, fp32) with HF and the torch engine.

For each model x layout: log-probs against the HF forward of the same weights; one GRPO update
(clip, KL, entropy active) against the torch engine's update from the same weights and batch; the
gradient of each loss term alone (policy, KL, entropy) against the torch engine's; logits of the
exported HF folder loaded in transformers against the megatron model::

    .venv/bin/python benchmarks/megatron_parity.py --json runs/megatron_parity.json
    .venv/bin/python benchmarks/megatron_parity.py --model DIR [--model DIR2] --layouts tp2,dp2
    .venv/bin/python benchmarks/megatron_parity.py --resume --reload --json runs/megatron_parity.json

By default it builds a tiny dense Qwen3 and a tiny Qwen3-MoE with scaled-up weights (peaked
log-probs; GQA, vocab padding) and a Qwen2.5-shaped model at transformers' own init (near-uniform
log-probs, where an error in the vocab-parallel normaliser's gradient shows); ``--model``
runs the same cases on any local Qwen2/Qwen2.5, Qwen3 or Qwen3-MoE HF folder. ``ep2`` runs on MoE
models only; ``tp2`` on dense models only (MoE with TP needs sequence parallelism, which the CPU
local spec cannot build: listed under "skipped" with the reason). Writes ``{"cases": [{"model",
"layout", "logprob_max_abs_diff", "update_max_rel_diff", "convert_logit_max_abs_diff",
"grad_max_rel_diff": {"policy", "kl", "entropy"}, "grad_worst_tensor": {...}, ...}], "ok": bool}``;
the goals are log-prob and convert diffs <= 1e-4, update diff <= 1e-3 (L2 error of the update
relative to the update, per tensor) and every term's gradient diff <= 1e-4 (L2 error relative to
the gradient's L2 norm, per HF tensor, max over tensors).

``--resume`` adds ``"resume"`` cases: save megatron's distributed checkpoint at one layout, resume
at the same or another (TP2 -> DP2, EP2 -> DP2), compare the next update with the run that simply
went on (goal: 0 at the same layout, <= 1e-5 across layouts). ``--reload`` adds ``"reload"``
cases: per-rank snapshot -> the GU's merge -> vLLM reload, then vLLM's log-probs of its own
samples against the trainer's (goal <= 1e-4; needs vLLM; the default models are the tiny
tokenizer-carrying ones of ``mindspeed_rl.models.tiny``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.parity.engine import LAYOUTS, run_parity_case  # noqa: E402
from benchmarks.parity.models import build_near_uniform_model, build_parity_model  # noqa: E402
from mindspeed_rl.weights.megatron_dims import load_dims  # noqa: E402

LOGPROB_GOAL = 1e-4
CONVERT_GOAL = 1e-4
UPDATE_GOAL = 1e-3
GRAD_GOAL = 1e-4
RESUME_CROSS_LAYOUT_GOAL = 1e-5
RELOAD_GOAL = 1e-4


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="write the results here (also printed)")
    p.add_argument("--model", type=Path, action="append", default=[], help="HF folder (repeatable)")
    p.add_argument(
        "--layouts", default="tp2,pp2,dp2,ep2", help=f"comma-separated subset of {sorted(LAYOUTS)}"
    )
    p.add_argument("--resume", action="store_true", help="also distributed-checkpoint resume cases")
    p.add_argument("--reload", action="store_true", help="also snapshot -> vLLM reload cases (needs vLLM)")
    return p.parse_args()


def _layouts(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(LAYOUTS))
    if unknown:
        raise SystemExit(f"unknown layouts {unknown}; choose from {sorted(LAYOUTS)}")
    return names


def _case(model: Path, layout: str) -> dict[str, Any]:
    start = time.perf_counter()
    result = dataclasses.asdict(run_parity_case(model, layout))
    result["model"] = str(model)
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["ok"] = (
        result["logprob_max_abs_diff"] <= LOGPROB_GOAL
        and result["convert_logit_max_abs_diff"] <= CONVERT_GOAL
        and result["update_max_rel_diff"] <= UPDATE_GOAL
        and all(v <= GRAD_GOAL for v in result["grad_max_rel_diff"].values())
        and result["roundtrip_max_abs_diff"] == 0.0
        and not result["name_mismatches"]
    )
    print(json.dumps(result), flush=True)
    return result


def _skip_reason(model: Path, layout: str) -> str | None:
    moe = load_dims(model).is_moe
    if layout == "ep2" and not moe:
        return "expert parallelism needs a MoE model"
    if layout == "tp2" and moe:
        return (
            "MoE at TP > 1 needs sequence parallelism (megatron MoELayer.forward refuses TP without it in "
            "training), and the CPU local spec's torch RMSNorm refuses sequence parallelism (torch_norm.py)"
        )
    return None


def _resume_cases(model: Path) -> list[dict[str, Any]]:
    from benchmarks.parity.resume import run_resume_case

    sharded = "ep2" if load_dims(model).is_moe else "tp2"
    out = []
    for saved, loaded in ((sharded, sharded), (sharded, "dp2")):
        start = time.perf_counter()
        result = dataclasses.asdict(run_resume_case(model, saved, loaded))
        result["model"], result["seconds"] = str(model), round(time.perf_counter() - start, 1)
        goal = 0.0 if saved == loaded else RESUME_CROSS_LAYOUT_GOAL
        result["ok"] = result["resume_max_abs_diff"] <= goal and result["load_max_abs_diff"] == 0.0
        print(json.dumps(result), flush=True)
        out.append(result)
    return out


def _reload_case(model: Path) -> dict[str, Any]:
    from benchmarks.parity.reload import run_reload_case

    layout = "ep2" if load_dims(model).is_moe else "tp2"
    start = time.perf_counter()
    result = {"model": str(model), "layout": layout, **run_reload_case(model, layout)}
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["ok"] = result["reload_logprob_max_abs_diff"] <= RELOAD_GOAL
    print(json.dumps(result), flush=True)
    return result


def _tokenizer_models(root: Path) -> list[Path]:
    from mindspeed_rl.models import tiny

    return [
        tiny.create_tiny_model(root / "tiny_qwen3_tok", dict(tiny.TINY_TEST_ARCH), seed=0),
        tiny.create_tiny_model(root / "tiny_qwen3_moe_tok", dict(tiny.TINY_QWEN3_MOE_ARCH), seed=0),
    ]


def main() -> None:
    args = parse_args()
    layouts = _layouts(args.layouts)
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="megatron-parity-models-") as tmp:
        models = list(args.model) or [
            build_parity_model(Path(tmp) / "tiny_qwen3", "qwen3"),
            build_parity_model(Path(tmp) / "tiny_qwen3_moe", "qwen3_moe"),
            build_near_uniform_model(Path(tmp) / "qwen25_near_uniform"),
        ]
        cases, skipped = [], []
        for model in models:
            for layout in layouts:
                reason = _skip_reason(model, layout)
                if reason:
                    skipped.append({"model": str(model), "layout": layout, "reason": reason})
                else:
                    cases.append(_case(model, layout))
        report = {"cases": cases, "skipped": skipped}
        if args.resume:
            report["resume"] = [r for model in models for r in _resume_cases(model)]
        if args.reload:
            reload_models = list(args.model) or _tokenizer_models(Path(tmp))
            report["reload"] = [_reload_case(model) for model in reload_models]
    extra = [r for key in ("resume", "reload") for r in report.get(key, [])]
    report["ok"] = all(c["ok"] for c in [*cases, *extra])
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
