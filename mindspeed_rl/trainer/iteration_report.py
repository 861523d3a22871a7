"""What both trainers do after an iteration: evaluate when due, write the metrics, log the console line.

``metrics.jsonl`` (and TensorBoard / W&B) get every iteration; the console gets a line every
``log_interval`` iterations and after every evaluation. Every ``eval_interval`` iterations
``eval_request`` hands the trainer loop the held-out prompts to decode on its rollout engines
(``workers/evaluator.py``); the loop puts the scores in that iteration's record.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.utils.metrics import MetricsWriter, format_progress
from mindspeed_rl.workers.evaluator import EvalRequest, EvalSettings, select_eval_prompts, write_eval_prompts

if TYPE_CHECKING:
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.plan.build import RunPlan

logger = logging.getLogger("mindspeed_rl.trainer")


class IterationReport:
    """One per run; use as a context manager (it owns the metric sinks)."""

    def __init__(
        self, run_dir: Path, plan: RunPlan, held_out: Sequence[PromptRecord], console_keys: tuple[str, ...]
    ) -> None:
        self._run_dir, self._keys = run_dir, console_keys
        self._eval = plan.evaluation
        self._num_iters = plan.data.train_iters
        self._eval_prompts = select_eval_prompts(held_out, self._eval)
        multi = plan.rollout.multi_turn
        self._eval_settings = EvalSettings.for_run(
            plan.rollout.sampling,
            self._eval,
            plan.rollout.seed,
            # Held-out prompts of a multi-turn run are decoded as trajectories with the run's tools.
            max_response_tokens=None if multi is None else multi.settings.max_total_response_length,
        )
        self._sink = MetricsWriter(run_dir, plan.logging)

    def __enter__(self) -> IterationReport:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sink.close()

    def eval_request(self, iteration: int) -> EvalRequest | None:
        """The evaluation due after ``iteration`` (its prompt ids logged), or None."""
        if not self._eval.due(iteration):
            return None
        write_eval_prompts(self._run_dir, iteration, [p.prompt_id for p in self._eval_prompts])
        return EvalRequest(prompts=self._eval_prompts, settings=self._eval_settings)

    def write(self, iteration: int, record: dict[str, Any]) -> None:
        """Write ``record`` to every sink; log it on the console every ``log_interval`` iterations
        and whenever it carries an evaluation."""
        written = self._sink.write(iteration, record)
        if "eval/accuracy" in record or self._sink.should_log(iteration):
            logger.info(format_progress(written, self._num_iters, self._keys))
