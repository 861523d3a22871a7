"""Periodic evaluation on held-out prompts, on the trainer's live weights.

    driver: select_eval_prompts(valid, EvalConfig) ─► TrainingUnit.evaluate(prompts, EvalSettings)
              │                                          └─ evaluate_policy(live model, ...)
              └─ write_eval_prompts(run_dir, iteration, ids)   (eval_prompts.jsonl: which ids were scored)

``evaluate_policy`` decodes with the HF engine's loop over the model the trainer is updating (no
copy to disk, no weight push), then scores with the run's reward function.

"Correct" (for ``eval/accuracy``, i.e. pass@1 averaged over prompts and samples): a sample whose
reward reaches the maximum the verifiers can give, every verifier scoring 1 (``reward >=
sum of positive weights``). For one 0/1 verifier that is ``reward > 0``; with partial-credit
verifiers (the demo task) only exact answers count; with ``[acc, format]`` a right answer in the
wrong format does not count. ``eval/reward_mean`` reports the graded reward beside it.

The module imports no torch at import time: the driver uses the selection and logging helpers.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from mindspeed_rl.contracts import EvalConfig
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.models.rewards import RewardFunction
    from mindspeed_rl.models.rollout.base import SamplingConfig

EVAL_PROMPTS_FILE = "eval_prompts.jsonl"
# Float slack for "every verifier gave full marks": weights are summed in a different order.
_FULL_MARKS_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalSettings:
    """How the Training Unit decodes held-out prompts (the run's rollout settings)."""

    sampling: SamplingConfig
    num_samples_per_prompt: int
    seed: int
    """Seeds the decode: every evaluation draws the same random stream, so differences between
    evaluations come from the weights, not the sampling noise."""
    max_num_seqs: int = 64
    max_model_len: int | None = None

    @classmethod
    def for_run(
        cls, sampling: SamplingConfig, config: EvalConfig, engine_keys: Mapping[str, Any], seed: int
    ) -> EvalSettings:
        """The run's sampling and batching (``generate_config``) with ``config``'s sample count."""
        return cls(
            sampling=sampling,
            num_samples_per_prompt=config.num_samples_per_prompt,
            seed=seed,
            max_num_seqs=int(engine_keys.get("max_num_seqs", 64)),
            max_model_len=engine_keys.get("max_model_len"),
        )


def select_eval_prompts(valid: Sequence[PromptRecord], config: EvalConfig) -> tuple[PromptRecord, ...]:
    """The fixed prompt subset every evaluation scores: the first ``max_prompts`` of ``valid``.

    Raises when evaluation is on but nothing is held out, naming the two ways to hold prompts out.
    """
    if config.interval is None:
        return ()
    if not valid:
        raise ValueError(
            f"megatron_training.eval_interval={config.interval} but there are no held-out prompts; "
            "give split a valid weight (e.g. split: '90,10,0') or set megatron_training.valid_data_path"
        )
    limit = len(valid) if config.max_prompts is None else config.max_prompts
    return tuple(valid[:limit])


def write_eval_prompts(run_dir: str | Path, iteration: int, prompt_ids: Sequence[str]) -> None:
    """Append which prompts an evaluation scored, so held-out-ness can be checked after the run."""
    with (Path(run_dir) / EVAL_PROMPTS_FILE).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"iteration": iteration, "prompt_ids": list(prompt_ids)}) + "\n")


def evaluate_policy(
    model: PreTrainedModel,
    tokenizer: Any,
    prompts: Sequence[PromptRecord],
    reward_fn: RewardFunction,
    settings: EvalSettings,
) -> dict[str, float]:
    """Generate ``num_samples_per_prompt`` responses per prompt with ``model`` as it is now, score
    them, and return ``eval/*`` metrics (see the module docstring for "correct")."""
    import numpy as np

    from mindspeed_rl.models.rollout.hf_engine import HFEngine

    if not prompts:
        raise ValueError("evaluate_policy got no prompts; pass at least one held-out prompt")
    if settings.num_samples_per_prompt < 1:
        raise ValueError(f"num_samples_per_prompt={settings.num_samples_per_prompt}; use 1 or more")
    full_marks = reward_fn.max_reward
    if full_marks <= 0:
        raise ValueError(
            f"verifier_weight {list(reward_fn.weights)} has no positive weight, so no response can be "
            "correct; give the accuracy verifier a positive weight"
        )
    tic = time.perf_counter()
    n = settings.num_samples_per_prompt
    with eval_mode(model):
        engine = HFEngine.from_model(
            model,
            seed=settings.seed,
            max_num_seqs=settings.max_num_seqs,
            max_model_len=settings.max_model_len,
        )
        completions = engine.generate([p.token_ids for p in prompts], settings.sampling, n=n)
    generate_s = time.perf_counter() - tic
    flat = [c for group in completions for c in group]
    responses = [tokenizer.decode(list(c.token_ids), skip_special_tokens=True) for c in flat]
    result = reward_fn(responses, [p.label for p in prompts for _ in range(n)])
    lengths = np.array([len(c.token_ids) for c in flat], dtype=np.float64)
    return {
        "eval/accuracy": float(np.mean(result.rewards >= full_marks - _FULL_MARKS_TOLERANCE)),
        "eval/reward_mean": float(result.rewards.mean()),
        "eval/response_length": float(lengths.mean()),
        "eval/truncated_fraction": float(np.mean([c.finish_reason == "length" for c in flat])),
        "eval/num_prompts": float(len(prompts)),
        "eval/num_samples": float(len(flat)),
        "eval/num_timed_out": float(result.num_timed_out),
        "time/eval_generate_s": generate_s,
        "time/eval_s": time.perf_counter() - tic,
    }


@contextlib.contextmanager
def eval_mode(model: PreTrainedModel) -> Iterator[None]:
    """Eval mode and eager attention for the decode; the model's own settings come back after.

    Eager because the decode loop left-pads prompts, and sdpa can turn fully masked pad rows into
    NaN that the KV cache then carries into real tokens (see ``hf_engine``).
    """
    was_training = model.training
    attention = model.config._attn_implementation
    model.eval()
    if attention != "eager":
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if attention != "eager":
            model.set_attn_implementation(attention)
        model.train(was_training)
