"""Periodic evaluation on held-out prompts: decoded on the run's rollout engines, scored by the trainer.

    driver: request = EvalRequest(select_eval_prompts(valid, EvalConfig), EvalSettings)
      hybrid: rollout actor.decode_held_out(job) ──► HeldOutDecode ──► TrainingUnit.score_held_out
      async:  ControlUnit.submit_eval(job) ─► a GU runs it on an actor holding >= job.min_version
              ControlUnit.wait_eval(job_id) ──► HeldOutDecode ──► TrainingUnit.score_held_out
    write_eval_prompts(run_dir, iteration, ids)   (eval_prompts.jsonl: which ids were scored)

Why on the rollout engines, as upstream does: they already hold the trainer's weights in the
inference layout (the hybrid loop has just pushed them; the async pipeline exports the evaluated
step's snapshot), and a sharded trainer would otherwise have to gather a whole model onto one rank.
The decode is seeded (``EvalSettings.seed``), so two evaluations differ by their weights, not by
their sampling noise. ``eval/weights_version`` says which weights were decoded.

"Correct" (for ``eval/accuracy``, i.e. pass@1 averaged over prompts and samples): a sample whose
reward reaches the maximum the verifiers can give, every verifier scoring 1 (``reward >=
sum of positive weights``). For one 0/1 verifier that is ``reward > 0``; with partial-credit
verifiers (the demo task) only exact answers count; with ``[acc, format]`` a right answer in the
wrong format does not count. ``eval/reward_mean`` reports the graded reward beside it.

The module imports no torch at import time: the driver uses the selection and logging helpers.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mindspeed_rl.contracts import EvalConfig
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.models.rewards import RewardFunction
    from mindspeed_rl.models.rollout.base import RolloutEngine, SamplingConfig
    from mindspeed_rl.runtime.records import ToolUse
    from mindspeed_rl.tools.agent_loop import AgentLoop
    from mindspeed_rl.tools.engines import EngineTurns

EVAL_PROMPTS_FILE = "eval_prompts.jsonl"
# Float slack for "every verifier gave full marks": weights are summed in a different order.
_FULL_MARKS_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalSettings:
    """How held-out prompts are decoded: the run's sampling, ``num_samples_per_prompt`` each."""

    sampling: SamplingConfig
    num_samples_per_prompt: int
    seed: int
    """Seeds the decode: every evaluation draws the same random stream, so differences between
    evaluations come from the weights, not the sampling noise."""

    max_response_tokens: int | None = None
    """Multi-turn runs: a response's token budget over all its turns
    (``max_total_response_length``); None: ``sampling.max_tokens``."""

    def __post_init__(self) -> None:
        if self.num_samples_per_prompt < 1:
            raise ValueError(f"num_samples_per_prompt={self.num_samples_per_prompt}; use 1 or more")

    @classmethod
    def for_run(
        cls,
        sampling: SamplingConfig,
        config: EvalConfig,
        seed: int,
        *,
        max_response_tokens: int | None = None,
    ) -> EvalSettings:
        """The run's sampling with ``config``'s sample count."""
        return cls(
            sampling=sampling,
            num_samples_per_prompt=config.num_samples_per_prompt,
            seed=seed,
            max_response_tokens=max_response_tokens,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalRequest:
    """One evaluation the driver wants: which prompts, decoded how."""

    prompts: tuple[PromptRecord, ...]
    settings: EvalSettings

    def job(self, job_id: int, min_version: int) -> EvalJob:
        return EvalJob(
            job_id=job_id,
            token_ids=tuple(p.token_ids for p in self.prompts),
            settings=self.settings,
            min_version=min_version,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalJob:
    """What a rollout engine decodes for one evaluation (crosses driver -> CU -> GU -> actor)."""

    job_id: int
    token_ids: tuple[tuple[int, ...], ...]
    settings: EvalSettings
    min_version: int
    """The weights to decode: the actor must hold this snapshot version or a newer one."""

    @property
    def max_new_tokens(self) -> int:
        """The most tokens the decode can generate (its hang bound is sized on it)."""
        settings = self.settings
        per_response = max(settings.sampling.max_tokens, settings.max_response_tokens or 0)
        return len(self.token_ids) * settings.num_samples_per_prompt * per_response


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldOutDecode:
    """A decoded evaluation: ``num_samples_per_prompt`` responses per prompt, prompt-major."""

    job_id: int
    responses: tuple[tuple[int, ...], ...]
    finish_reasons: tuple[str, ...]
    weights_version: int
    """The snapshot version the engine held (the hybrid loop: the iteration whose weights were pushed)."""
    generate_s: float
    loss_masks: tuple[tuple[int, ...], ...] = ()
    """Multi-turn runs: per response, 1 for the model's tokens, 0 for tool responses (so the
    reward reads the model's own text, as in training). Empty for single-turn decodes."""
    tool_use: tuple[ToolUse, ...] = ()
    """Multi-turn runs: what each response did with its tools (``eval/tools/*``)."""


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


def decode_held_out(engine: RolloutEngine, job: EvalJob, weights_version: int) -> HeldOutDecode:
    """Decode ``job`` on ``engine`` as it is now, seeded by the job's settings."""
    settings = job.settings
    if not job.token_ids:
        raise ValueError("an evaluation needs at least one held-out prompt; got none")
    tic = time.perf_counter()
    sampling = dataclasses.replace(settings.sampling, seed=settings.seed)
    completions = engine.generate(list(job.token_ids), sampling, n=settings.num_samples_per_prompt)
    flat = [c for group in completions for c in group]
    return HeldOutDecode(
        job_id=job.job_id,
        responses=tuple(tuple(c.token_ids) for c in flat),
        finish_reasons=tuple(c.finish_reason for c in flat),
        weights_version=weights_version,
        generate_s=time.perf_counter() - tic,
    )


def decode_held_out_with_tools(
    agent: AgentLoop, turns: EngineTurns, job: EvalJob, weights_version: int
) -> HeldOutDecode:
    """``decode_held_out`` for a multi-turn run: each sample is a trajectory of the run's agent
    loop (its tools, parser and limits) decoded with the job's seeded sampling."""
    from mindspeed_rl.runtime.records import ToolUse

    settings = job.settings
    if not job.token_ids:
        raise ValueError("an evaluation needs at least one held-out prompt; got none")
    tic = time.perf_counter()
    sampling = dataclasses.replace(settings.sampling, seed=settings.seed)
    prompts = [ids for ids in job.token_ids for _ in range(settings.num_samples_per_prompt)]
    results = agent.run(prompts, engine=turns.with_sampling(sampling))
    return HeldOutDecode(
        job_id=job.job_id,
        responses=tuple(tuple(r.completion.token_ids) for r in results),
        finish_reasons=tuple(r.completion.finish_reason for r in results),
        weights_version=weights_version,
        generate_s=time.perf_counter() - tic,
        loss_masks=tuple(tuple(r.completion.loss_mask or ()) for r in results),
        tool_use=tuple(
            ToolUse(
                turns=r.stats.turns,
                calls=r.stats.tool_calls,
                errors=r.stats.tool_errors,
                truncated=r.stats.truncated_responses,
                seconds=r.stats.tool_seconds,
            )
            for r in results
        ),
    )


def score_held_out(
    decoded: HeldOutDecode, prompts: Sequence[PromptRecord], tokenizer: Any, reward_fn: RewardFunction
) -> dict[str, float]:
    """``eval/*`` metrics of ``decoded`` (see the module docstring for "correct")."""
    import numpy as np

    full_marks = reward_fn.max_reward
    if full_marks <= 0:
        raise ValueError(
            f"verifier_weight {list(reward_fn.weights)} has no positive weight, so no response can be "
            "correct; give the accuracy verifier a positive weight"
        )
    if not prompts or len(decoded.responses) % len(prompts):
        raise ValueError(
            f"{len(decoded.responses)} decoded responses for {len(prompts)} prompts; an evaluation "
            "decodes the same number of samples for every prompt"
        )
    tic = time.perf_counter()
    n = len(decoded.responses) // len(prompts)
    texts = [tokenizer.decode(list(ids), skip_special_tokens=True) for ids in decoded.responses]
    records = None
    if decoded.loss_masks:
        from mindspeed_rl.models.rewards.retool import tool_record

        def decode(ids: list[int]) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=True))

        found = [
            tool_record(r, m, decode) for r, m in zip(decoded.responses, decoded.loss_masks, strict=True)
        ]
        records = found if any(r is not None for r in found) else None
    result = reward_fn(texts, [p.label for p in prompts for _ in range(n)], records)
    lengths = np.array([len(ids) for ids in decoded.responses], dtype=np.float64)
    return {
        **_tool_metrics(decoded.tool_use),
        "eval/accuracy": float(np.mean(result.rewards >= full_marks - _FULL_MARKS_TOLERANCE)),
        "eval/reward_mean": float(result.rewards.mean()),
        "eval/response_length": float(lengths.mean()),
        "eval/truncated_fraction": float(np.mean([r == "length" for r in decoded.finish_reasons])),
        "eval/num_prompts": float(len(prompts)),
        "eval/num_samples": float(len(texts)),
        "eval/num_timed_out": float(result.num_timed_out),
        "eval/weights_version": float(decoded.weights_version),
        "time/eval_generate_s": decoded.generate_s,
        "time/eval_score_s": time.perf_counter() - tic,
    }


def _tool_metrics(tool_use: Sequence[ToolUse]) -> dict[str, float]:
    """``eval/tools/*``: how the held-out trajectories used their tools (multi-turn runs only)."""
    if not tool_use:
        return {}
    calls = sum(t.calls for t in tool_use)
    errors = sum(t.errors for t in tool_use)
    return {
        "eval/tools/calls_per_sample": calls / len(tool_use),
        "eval/tools/calling_fraction": sum(t.calls > 0 for t in tool_use) / len(tool_use),
        # Of the calls made, the share answered without error (1.0 when none was made).
        "eval/tools/ok_call_fraction": (calls - errors) / calls if calls else 1.0,
        "eval/tools/turns_per_sample": sum(t.turns for t in tool_use) / len(tool_use),
        "eval/tools/truncated_responses": float(sum(t.truncated for t in tool_use)),
        "eval/tools/seconds": sum(t.seconds for t in tool_use),
    }
