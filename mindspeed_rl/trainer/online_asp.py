"""Online ASP in the async run: the Control Unit's ``OnlineHook`` (``runtime.replan``), built here.

The CU calls it on every accepted minibatch (true lengths feed the predictor and the starvation
tracker), on every consumed global batch, and after every trainer step, where it refits the
calibration every ``asp_config.refit_interval`` steps and re-plans the unsent tail every
``replan_interval`` steps through ``ControlLoop.replan_unsent`` (which holds the loop's lock and
keeps dispatched, running, queued and re-queued work as it is). Per-refit quality and per-re-plan
wall time go into the step's metrics (``metrics.jsonl``); the counts and the starvation figures
into ``summary.json``. The prior of a prompt is its offline prediction from the run's
``asp_schedule.json``; a prompt the schedule gained later (DAPO over-sampling) starts from the
mean prior. The predictor keys a prompt by ``prompt_alias.prompt_of``, so a later pass's draw
(``q17@1``) is estimated from the length ``q17`` was last measured at: the per-prompt history
is what online ASP has over the offline prediction once a run repeats its prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mindspeed_rl.datasets.prompt_alias import prompt_of
from mindspeed_rl.runtime.records import CompletedMinibatch, GlobalBatch, Sample, ScheduledMinibatch
from mindspeed_rl.runtime.replan import ReplanOutcome, TailPlan, TailPlanner
from mindspeed_rl.runtime.starvation import StarvationTracker
from mindspeed_rl.tools.trajectory_cost import DecodeRate, TrajectoryWork, trajectory_cost

if TYPE_CHECKING:
    from asp_scheduler.params import ScheduleParams
    from mindspeed_rl.config_cls import ASPConfig


class OnlineAsp:
    """The concrete ``OnlineHook``: picklable, so Ray ships it to the CU actor."""

    def __init__(
        self,
        prior: dict[str, float],
        params: ScheduleParams,
        *,
        refit_interval: int = 1,
        replan_interval: int = 1,
        recency_window: int = 256,
    ) -> None:
        from asp_scheduler.online import OnlinePredictor

        keyed: dict[str, float] = {}
        for p, v in prior.items():  # a prompt's first draw gives its prior
            keyed.setdefault(prompt_of(p), v)
        self.predictor = OnlinePredictor(keyed, window=recency_window)
        self.params = params
        self.refit_interval, self.replan_interval = refit_interval, replan_interval
        self._default_prior = float(np.mean(list(prior.values()))) if prior else 1.0
        self.starvation = StarvationTracker()
        # Multi-turn: what a trajectory's tool waits are worth in tokens (tools/trajectory_cost.py).
        self.decode_rate = DecodeRate()
        self.replan_walls: list[float] = []
        self.num_refits = 0

    def on_scheduled(self, schedule: Sequence[ScheduledMinibatch], now: float) -> None:
        for mb in schedule:  # a streaming chunk's prompts: their offline prediction is the prior
            for p in mb.prompt_ids:
                if not self.predictor.knows(prompt_of(p)):
                    self.predictor.add_prior(prompt_of(p), max(mb.predicted_load / mb.num_prompts, 1.0))
        self.starvation.on_available([p for mb in schedule for p in mb.prompt_ids], now)

    def observe(self, completed: CompletedMinibatch) -> None:
        """A single-turn sample costs its response tokens; a multi-turn one its trajectory cost
        (tool-response tokens included, tool seconds as token-equivalents at the measured rate)."""
        lengths: dict[str, list[float]] = {}
        works = [sample_work(s) for s in completed.samples]
        rate = None
        if any(s.tool_use is not None for s in completed.samples):
            rate = self.decode_rate.observe(works, completed.generation_seconds)
        for s, work in zip(completed.samples, works):
            lengths.setdefault(s.prompt_id, []).append(trajectory_cost(work, rate))
        for prompt, values in lengths.items():
            key = self._ensure_prior(prompt)
            self.predictor.observe(key, float(np.mean(values)))
        self.starvation.on_generated(completed)

    def on_consumed(self, batch: GlobalBatch, now: float) -> None:
        self.starvation.on_consumed(batch, now)

    def after_step(self, step: int, replan: Callable[[TailPlanner], ReplanOutcome]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        done = step + 1
        if done % self.refit_interval == 0:
            self.num_refits += 1
            for report in self.predictor.refit():
                key = f"asp/{report.source}"
                metrics[f"{key}_pairs"] = float(report.num_pairs)
                if report.num_pairs:
                    metrics[f"{key}_mae_tokens"] = report.mae_tokens
                    metrics[f"{key}_calibration_error"] = report.calibration_error
                if report.kendall_tau is not None:
                    metrics[f"{key}_kendall_tau"] = report.kendall_tau
        if done % self.replan_interval == 0:
            outcome = self.replan_now(replan)
            if outcome.num_prompts:
                metrics["asp/replan_wall_s"] = outcome.wall_seconds
                metrics["asp/replan_prompts"] = float(outcome.num_prompts)
        return metrics

    def replan_now(self, replan: Callable[[TailPlanner], ReplanOutcome]) -> ReplanOutcome:
        """Re-plan the unsent tail from today's estimates. Also called as a streaming window's
        chunk arrives: the GUs take a small window's work at once, so waiting for the next
        ``after_step`` would leave the chunk in the order the offline predictor gave it."""
        outcome = replan(self._plan)
        if outcome.num_prompts:
            self.replan_walls.append(outcome.wall_seconds)
        return outcome

    def summary(self) -> dict[str, Any]:
        walls = self.replan_walls
        return {
            "schedule_replans": len(walls),
            "replan_wall_s_mean": float(np.mean(walls)) if walls else None,
            "replan_wall_s_max": float(np.max(walls)) if walls else None,
            "asp_refits": self.num_refits,
            "decode_tokens_per_s": self.decode_rate.tokens_per_s,  # multi-turn runs only, else None
            "starvation": self.starvation.summary(),
        }

    def _ensure_prior(self, prompt: str) -> str:
        """The predictor's key of a scheduled id, given the mean prior if it has none yet."""
        key = prompt_of(prompt)
        if not self.predictor.knows(key):
            self.predictor.add_prior(key, self._default_prior)
        return key

    def _plan(self, prompt_ids: tuple[str, ...]) -> TailPlan:
        from asp_scheduler.online import replan

        keys = [self._ensure_prior(p) for p in prompt_ids]
        plan = replan(self.predictor.estimates(keys), self.params)
        return TailPlan(
            minibatches=tuple(tuple(int(i) for i in m) for m in plan.minibatches),
            batch_groups=tuple(int(g) for g in plan.batch_group_ids),
            loads=tuple(float(x) for x in plan.loads),
        )


def sample_work(sample: Sample) -> TrajectoryWork:
    """The cost model's view of one sample (a single-turn one: all tokens the model's, no tools)."""
    tokens = len(sample.response_token_ids)
    model_tokens = sum(sample.loss_mask) if sample.loss_mask else tokens
    seconds = sample.tool_use.seconds if sample.tool_use is not None else 0.0
    return TrajectoryWork(response_tokens=tokens, model_tokens=model_tokens, tool_seconds=seconds)


def carry_schedule(
    lineage: Sequence[ScheduledMinibatch], current: Sequence[ScheduledMinibatch]
) -> tuple[ScheduledMinibatch, ...]:
    """The lineage's schedule for a checkpoint: the CU's ``current`` one (re-planned) plus the
    lineage's prompts it no longer holds (consumed before this run started, since a resumed run's
    CU only gets the remaining ones), renumbered after it so no id, group or position repeats."""
    held = {p for mb in current for p in mb.prompt_ids}
    earlier = [kept for mb in lineage if (kept := tuple(p for p in mb.prompt_ids if p not in held))]
    if not earlier:
        return tuple(current)
    next_id = max((mb.minibatch_id for mb in current), default=-1) + 1
    next_group = max((mb.batch_group_id for mb in current), default=-1) + 1
    next_order = max((mb.order_index for mb in current), default=-1) + 1
    done = tuple(
        ScheduledMinibatch(
            minibatch_id=next_id + i,
            prompt_ids=prompts,
            batch_group_id=next_group,
            predicted_load=0.0,
            order_index=next_order + i,
        )
        for i, prompts in enumerate(earlier)
    )
    return (*current, *done)


def online_hook(
    asp: ASPConfig | None,
    schedule: Sequence[ScheduledMinibatch],
    run_dir: Path,
    *,
    prior: Mapping[str, float] | None = None,
) -> OnlineAsp | None:
    """The hook for an ``asp_config.online`` run, else ``None``. ``prior``: per-prompt offline
    predictions given by the caller (a trace replay); by default read from the run dir."""
    if asp is None or not asp.online:
        return None
    asp.check_online()
    return OnlineAsp(
        {p: max(float(v), 1.0) for p, v in prior.items()} if prior is not None else _prior(schedule, run_dir),
        asp.schedule_params(),
        refit_interval=asp.refit_interval,
        replan_interval=asp.replan_interval,
        recency_window=asp.recency_window,
    )


def _prior(schedule: Sequence[ScheduledMinibatch], run_dir: Path) -> dict[str, float]:
    """Per-prompt offline predictions: the run's schedule artifact, else each minibatch's mean."""
    from asp_scheduler.schedule import Schedule
    from mindspeed_rl.trainer.run_schedule import SCHEDULE_FILE

    prior = {p: mb.predicted_load / mb.num_prompts for mb in schedule for p in mb.prompt_ids}
    artifact = run_dir / SCHEDULE_FILE
    if artifact.is_file():
        saved = Schedule.load(artifact)
        if saved.item_ids is not None:
            known = dict(zip(saved.item_ids, saved.predicted_lengths.tolist()))
            prior.update({p: known[p] for p in prior if p in known})
    return {p: max(float(v), 1.0) for p, v in prior.items()}
