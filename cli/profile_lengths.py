"""Profile response lengths: run the policy on a prompt subset and write prompt-length pairs.

    python cli/profile_lengths.py --model MODEL_DIR --prompts prompts.jsonl --out lengths.jsonl \\
        --num-prompts 200 --n-samples 4 --max-tokens 512 [--backend vllm|hf]

Input: JSONL, one prompt per line, with an id (`--id-field`) and either text (`--text-field`,
tokenized with the model folder's tokenizer) or token ids (`--token-ids-field`).
Output: JSONL, one line per sample: `prompt_id`, `prompt`, `response_tokens`, `sample_idx` and
`finish_reason` ("length" marks a response cut at --max-tokens: its true length is at least that).
`asp_scheduler.predictors` fit on (prompt text, response_tokens) from this file.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindspeed_rl.models.rollout import RolloutEngine, SamplingConfig, build_rollout_engine


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfilePrompt:
    prompt_id: str
    text: str
    token_ids: tuple[int, ...]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF model folder (the policy)")
    p.add_argument("--prompts", required=True, help="JSONL prompt file")
    p.add_argument("--out", required=True, help="output JSONL of prompt-length pairs")
    p.add_argument("--backend", choices=("vllm", "hf"), default="vllm")
    p.add_argument("--id-field", default="prompt_id")
    p.add_argument("--text-field", default="prompt")
    p.add_argument("--token-ids-field", default=None, help="use these token ids instead of tokenizing text")
    p.add_argument("--apply-chat-template", action="store_true", help="wrap text as one user turn")
    p.add_argument("--num-prompts", type=int, default=None, help="random subset size (default: all)")
    p.add_argument("--n-samples", type=int, default=1, help="responses per prompt")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=64, help="prompts per generate call")
    p.add_argument("--seed", type=int, default=0)
    return p


def read_prompts(args: argparse.Namespace) -> list[ProfilePrompt]:
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    if args.num_prompts is not None:
        if not 1 <= args.num_prompts <= len(rows):
            raise ValueError(
                f"--num-prompts {args.num_prompts} must be in [1, {len(rows)}] for {args.prompts}"
            )
        keep = sorted(random.Random(args.seed).sample(range(len(rows)), args.num_prompts))
        rows = [rows[i] for i in keep]
    tokenizer = None
    if args.token_ids_field is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)
    return [_prompt(row, i, args, tokenizer) for i, row in enumerate(rows)]


def _prompt(row: dict[str, Any], index: int, args: argparse.Namespace, tokenizer: Any) -> ProfilePrompt:
    if args.id_field not in row:
        raise ValueError(f"{args.prompts}: row {index} has no {args.id_field!r}; pass --id-field")
    text = row.get(args.text_field)
    if tokenizer is None:
        ids = row.get(args.token_ids_field)
        if not isinstance(ids, list) or not ids:
            raise ValueError(f"{args.prompts}: row {index} has no token list in {args.token_ids_field!r}")
        return ProfilePrompt(prompt_id=str(row[args.id_field]), text=str(text or ""), token_ids=tuple(ids))
    if not isinstance(text, str):
        raise ValueError(f"{args.prompts}: row {index} has no text in {args.text_field!r}; pass --text-field")
    if args.apply_chat_template:
        messages = [{"role": "user", "content": text}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ProfilePrompt(prompt_id=str(row[args.id_field]), text=text, token_ids=tuple(ids))


def profile(
    engine: RolloutEngine, prompts: Sequence[ProfilePrompt], sampling: SamplingConfig, n: int, batch_size: int
) -> list[dict[str, Any]]:
    """One output row per (prompt, sample), in prompt order."""
    rows: list[dict[str, Any]] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        # A fresh seed per batch: reusing one would replay the same sampling noise in every batch.
        seeded = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + start * n)
        results = engine.generate([p.token_ids for p in batch], seeded, n=n)
        for prompt, samples in zip(batch, results, strict=True):
            for j, c in enumerate(samples):
                rows.append(
                    {
                        "prompt_id": prompt.prompt_id,
                        "prompt": prompt.text,
                        "response_tokens": len(c.token_ids),
                        "sample_idx": j,
                        "finish_reason": c.finish_reason,
                    }
                )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.n_samples < 1 or args.batch_size < 1:
        raise ValueError("--n-samples and --batch-size must be >= 1")
    prompts = read_prompts(args)
    sampling = SamplingConfig(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
    )
    longest = max(len(p.token_ids) for p in prompts)
    config = {"max_model_len": args.max_model_len or longest + args.max_tokens}
    engine = build_rollout_engine(args.backend, args.model, config, seed=args.seed)
    try:
        rows = profile(engine, prompts, sampling, args.n_samples, args.batch_size)
    finally:
        engine.shutdown()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(out)  # readers never see a half-written file
    capped = sum(r["finish_reason"] == "length" for r in rows)
    print(f"profiled {len(prompts)} prompts x {args.n_samples} samples -> {out} ({capped} hit --max-tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
