"""Parity of the megatron-core engine (CPU, gloo, 2 processes, fp32) with HF and the torch engine.

For each model x layout: log-probs against the HF forward of the same weights; one GRPO update
(clip, KL, entropy active) against the torch engine's update from the same weights and batch;
logits of the exported HF folder loaded in transformers against the megatron model::

    .venv/bin/python benchmarks/megatron_parity.py --json runs/megatron_parity.json
    .venv/bin/python benchmarks/megatron_parity.py --model DIR [--model DIR2] --layouts tp2,dp2

By default it builds a tiny dense Qwen3 and a tiny Qwen3-MoE itself (GQA, vocab padding); ``--model``
runs the same cases on any local Qwen2/Qwen2.5, Qwen3 or Qwen3-MoE HF folder. ``ep2`` runs on MoE
models only; ``tp2`` on dense models only (MoE with TP needs sequence parallelism, which the CPU
local spec cannot build: listed under "skipped" with the reason). Writes ``{"cases": [{"model", "layout", "logprob_max_abs_diff", "update_max_rel_diff",
"convert_logit_max_abs_diff", ...}], "ok": bool}``; the goals are log-prob and convert diffs
<= 1e-4 and update diff <= 1e-3 (L2 error of the update relative to the update, per tensor).
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

from mindspeed_rl.models.training.megatron.hf_mapping import load_dims  # noqa: E402
from mindspeed_rl.models.training.megatron.parity import LAYOUTS, build_parity_model, run_parity_case  # noqa: E402

LOGPROB_GOAL = 1e-4
CONVERT_GOAL = 1e-4
UPDATE_GOAL = 1e-3


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="write the results here (also printed)")
    p.add_argument("--model", type=Path, action="append", default=[], help="HF folder (repeatable)")
    p.add_argument(
        "--layouts", default="tp2,pp2,dp2,ep2", help=f"comma-separated subset of {sorted(LAYOUTS)}"
    )
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


def main() -> None:
    args = parse_args()
    layouts = _layouts(args.layouts)
    with tempfile.TemporaryDirectory(prefix="megatron-parity-models-") as tmp:
        models = list(args.model) or [
            build_parity_model(Path(tmp) / "tiny_qwen3", "qwen3"),
            build_parity_model(Path(tmp) / "tiny_qwen3_moe", "qwen3_moe"),
        ]
        cases, skipped = [], []
        for model in models:
            for layout in layouts:
                reason = _skip_reason(model, layout)
                if reason:
                    skipped.append({"model": str(model), "layout": layout, "reason": reason})
                else:
                    cases.append(_case(model, layout))
    report = {"cases": cases, "skipped": skipped, "ok": all(c["ok"] for c in cases)}
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
