"""Held-out quality of the text-feature length predictor on real measured lengths.

    .venv/bin/python benchmarks/predictor_quality.py --json runs/predictor_quality.json

For each dataset: prompt-grouped holdouts (no prompt on both sides) over several seeds, Kendall tau
and MAE against single samples, for both ways of combining repeated samples.  Two references are
scored on the same held-out rows: the per-prompt-mean oracle (each row predicted by the mean of the
OTHER samples of its prompt; sampling noise caps every per-prompt predictor near it) and the
prompt character length alone.  The AIME set is an evaluation set: measured here, never tuned on.
A dataset whose file is absent is skipped with a message.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# Runnable from a plain checkout, without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asp_scheduler.predictors.base import PromptItem, evaluate_predictor
from asp_scheduler.predictors.holdout import group_by_prompt, holdout_quality, split_by_prompt
from asp_scheduler.predictors.text_features import TextFeatureConfig, TextFeaturePredictor

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DATASETS = {
    "math100_qwen25_math": DATA / "math100_qwen25_math_lengths.jsonl",
    "aime_r1distill_1p5b": DATA / "eval" / "aime_r1distill_1p5b_lengths.jsonl",
}
TIMING_PROMPTS = DATA / "deepmath_prompts.jsonl"


def load_pairs(path: Path) -> tuple[list[PromptItem], np.ndarray]:
    """Rows with prompt text only (the AIME file has text for part of its years)."""
    prompts, lengths = [], []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if row.get("prompt"):
                prompts.append(PromptItem(prompt_id=str(row["prompt_id"]), text=row["prompt"]))
                lengths.append(float(row["response_tokens"]))
    return prompts, np.asarray(lengths)


def leave_one_out_means(prompts: list[PromptItem], lengths: np.ndarray) -> np.ndarray:
    groups = group_by_prompt(prompts, lengths)
    sums = np.bincount(groups.row_to_group, weights=lengths)[groups.row_to_group]
    counts = groups.counts[groups.row_to_group]
    if np.any(counts < 2):
        raise ValueError("the per-prompt-mean oracle needs >= 2 samples per prompt")
    return (sums - lengths) / (counts - 1)


def summarise(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "std": float(np.std(values))}


def evaluate_dataset(prompts: list[PromptItem], lengths: np.ndarray, seeds: int, holdout: float) -> dict:
    oracle = leave_one_out_means(prompts, lengths)
    chars = np.array([len(p.text) for p in prompts], dtype=np.float64)
    result: dict[str, object] = {"num_rows": len(prompts), "num_prompts": len({p.prompt_id for p in prompts})}
    refs: dict[str, list[tuple[float, float]]] = {"oracle_prompt_mean": [], "prompt_chars": []}
    for seed in range(seeds):
        _, test = split_by_prompt(prompts, holdout_fraction=holdout, seed=seed)
        for name, pred in (("oracle_prompt_mean", oracle), ("prompt_chars", chars)):
            q = evaluate_predictor(pred[test], lengths[test])
            refs[name].append((q.kendall_tau, q.mae_tokens))
    for name, pairs in refs.items():
        result[name] = {"tau": summarise([t for t, _ in pairs])}
    result["oracle_prompt_mean_all_rows_tau"] = evaluate_predictor(oracle, lengths).kendall_tau
    for aggregate in ("pairs", "prompt_mean"):
        cfg = TextFeatureConfig(aggregate=aggregate)
        qualities = [
            holdout_quality(TextFeaturePredictor(cfg), prompts, lengths, holdout_fraction=holdout, seed=s)
            for s in range(seeds)
        ]
        taus = [q.kendall_tau for q in qualities]
        result[f"text_features_{aggregate}"] = {
            "tau": summarise(taus),
            "mae_tokens": summarise([q.mae_tokens for q in qualities]),
            "tau_over_oracle": float(np.mean(taus) / np.mean([t for t, _ in refs["oracle_prompt_mean"]])),
        }
    start = time.perf_counter()
    TextFeaturePredictor().fit(prompts, lengths)
    result["fit_seconds_all_rows"] = time.perf_counter() - start
    return result


def time_fit(num_prompts: int) -> dict[str, float] | None:
    """Fit speed on distinct real prompts; the target (prompt token count) is a stand-in, timing only."""
    if not TIMING_PROMPTS.is_file():
        print(f"skip timing: {TIMING_PROMPTS} not found")
        return None
    rows = [json.loads(line) for line in TIMING_PROMPTS.open(encoding="utf-8")][:num_prompts]
    prompts = [PromptItem(prompt_id=str(i), text=r["problem"]) for i, r in enumerate(rows)]
    target = np.array([float(r["prompt_tokens_qwen"]) for r in rows])
    start = time.perf_counter()
    TextFeaturePredictor().fit(prompts, target)
    fit_s = time.perf_counter() - start
    start = time.perf_counter()
    TextFeaturePredictor().fit(prompts, target).predict(prompts)
    return {
        "num_prompts": len(prompts),
        "fit_seconds": fit_s,
        "fit_predict_seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--seeds", type=int, default=5, help="prompt-grouped holdout splits per dataset")
    parser.add_argument("--holdout", type=float, default=0.2, help="fraction of prompts held out")
    parser.add_argument("--timing-prompts", type=int, default=4000, help="distinct prompts in the speed test")
    args = parser.parse_args()
    results: dict[str, object] = {"config": {"seeds": args.seeds, "holdout_fraction": args.holdout}}
    for name, path in DATASETS.items():
        if not path.is_file():
            print(f"skip {name}: {path} not found")
            continue
        prompts, lengths = load_pairs(path)
        results[name] = res = evaluate_dataset(prompts, lengths, args.seeds, args.holdout)
        print(f"{name}: {res['num_rows']} rows / {res['num_prompts']} prompts")
        for key in ("text_features_pairs", "text_features_prompt_mean", "oracle_prompt_mean", "prompt_chars"):
            entry = res[key]
            mae = f"  MAE {entry['mae_tokens']['mean']:.0f} tok" if "mae_tokens" in entry else ""
            print(f"  {key:28s} tau {entry['tau']['mean']:.3f} ± {entry['tau']['std']:.3f}{mae}")
        print(f"  fit on all rows: {res['fit_seconds_all_rows']:.2f} s")
    results["timing"] = timing = time_fit(args.timing_prompts)
    if timing:
        print(f"fit on {timing['num_prompts']} distinct prompts: {timing['fit_seconds']:.2f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
