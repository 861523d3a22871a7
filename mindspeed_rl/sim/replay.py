"""Trace replay on the real async pipeline: plans per scheduling condition, and reading results back.

The replay runs the real Control Unit, Generation Units, engines, Training Queue, backpressure and
snapshot export/convert/reload; only two things are replaced (as in the paper's App. F.6.3):

* each sample's response length is forced to its (scaled) trace length, EOS ignored, so decode
  work follows the trace while the tiny model's text is irrelevant (prompts are synthetic ids);
* the trainer step is a fixed sleep: no reward, no update, the exported weights never change.

The schedules come from ``sim.conditions`` (one noisy-oracle prediction vector for every
condition) and the table from ``sim.table4b``, so replay and simulator share their definitions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.runtime import events as ev
from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.sim.conditions import build_condition_schedules
from mindspeed_rl.sim.workload import Workload

if TYPE_CHECKING:
    from asp_scheduler.params import ScheduleParams

EVENT_TYPES: dict[str, type] = {
    t.__name__: t
    for t in (
        ev.MinibatchIssued,
        ev.MinibatchStarted,
        ev.MinibatchReceived,
        ev.MinibatchRequeued,
        ev.BackpressureChanged,
        ev.GlobalBatchPopped,
        ev.TrainStepDone,
        ev.SnapshotPublished,
        ev.SnapshotConverted,
        ev.WeightsLoaded,
    )
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayPlan:
    """What one replayed condition feeds the async trainer (``grpo_trainer_async.train``)."""

    condition: str
    prompts: tuple[PromptRecord, ...]
    schedule: tuple[ScheduledMinibatch, ...]
    forced_lengths: Mapping[str, tuple[int, ...]]
    """Per prompt, the response length of each of its ``n`` samples (tokens)."""
    step_seconds: float
    """Simulated trainer step duration."""

    @property
    def total_response_tokens(self) -> int:
        return sum(sum(v) for v in self.forced_lengths.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayPlans:
    plans: dict[str, ReplayPlan]
    measured_tau: float
    num_clipped_samples: int
    """Samples whose scaled trace length exceeded the engine's limit and were clipped to it."""


def forced_lengths(workload: Workload, limit: int) -> tuple[dict[str, tuple[int, ...]], int]:
    """Per-sample lengths clipped to ``limit`` tokens, and how many samples were clipped."""
    if limit < 1:
        raise ValueError(f"length limit {limit} < 1; raise sampling max_tokens / max_model_len.")
    clipped = np.minimum(workload.lengths, limit)
    num_clipped = int((workload.lengths > limit).sum())
    out = {pid: tuple(int(x) for x in row) for pid, row in zip(workload.prompt_ids, clipped)}
    return out, num_clipped


def synthetic_prompts(
    prompt_ids: Sequence[str], *, num_tokens: int, vocab_size: int
) -> tuple[PromptRecord, ...]:
    """Token-id prompts (distinct per prompt); the replay only needs something to decode from."""
    if num_tokens < 1 or vocab_size < 2:
        raise ValueError(f"need num_tokens >= 1 and vocab_size >= 2, got {num_tokens}, {vocab_size}.")
    records = []
    for i, pid in enumerate(prompt_ids):
        ids = tuple(1 + (i * 7 + j * 13) % (vocab_size - 1) for j in range(num_tokens))
        records.append(PromptRecord(prompt_id=pid, text=f"replay prompt {i}", token_ids=ids, label=""))
    return tuple(records)


def build_replay_plans(
    workload: Workload,
    params: ScheduleParams,
    conditions: Sequence[str],
    *,
    tau: float,
    step_seconds: float,
    length_limit: int,
    prompt_tokens: int,
    vocab_size: int,
) -> ReplayPlans:
    """One plan per condition: same prompts, forced lengths and predictions; only the order differs."""
    if step_seconds < 0:
        raise ValueError(f"step_seconds={step_seconds}; the simulated trainer step needs a duration >= 0.")
    lengths, num_clipped = forced_lengths(workload, length_limit)
    built = build_condition_schedules(workload, params, conditions, tau=tau)
    prompts = synthetic_prompts(workload.prompt_ids, num_tokens=prompt_tokens, vocab_size=vocab_size)
    plans = {
        name: ReplayPlan(
            condition=name,
            prompts=prompts,
            schedule=tuple(schedule),
            forced_lengths=lengths,
            step_seconds=step_seconds,
        )
        for name, schedule in built.schedules.items()
    }
    return ReplayPlans(plans=plans, measured_tau=built.measured_tau, num_clipped_samples=num_clipped)


PLAN_FILE = "replay_plan.json"


def write_plan(plan: ReplayPlan, run_dir: str | Path) -> Path:
    """The condition's dispatch order with every sample's forced length (``read_plan_lengths``)."""
    minibatches = [
        {
            "minibatch_id": mb.minibatch_id,
            "batch_group_id": mb.batch_group_id,
            "prompt_ids": list(mb.prompt_ids),
            "lengths": [list(plan.forced_lengths[pid]) for pid in mb.prompt_ids],
        }
        for mb in plan.schedule
    ]
    payload = {"condition": plan.condition, "step_seconds": plan.step_seconds, "minibatches": minibatches}
    out = Path(run_dir) / PLAN_FILE
    out.write_text(json.dumps(payload))
    return out


def read_plan(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / PLAN_FILE
    if not path.is_file():
        raise ValueError(f"{path} does not exist; it is written by cli/replay_trace.py for each condition.")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def read_plan_lengths(run_dir: str | Path) -> dict[int, np.ndarray]:
    """Per minibatch id, the forced lengths of all its samples (flattened), from ``write_plan``."""
    return {
        int(mb["minibatch_id"]): np.array([x for row in mb["lengths"] for x in row], dtype=np.int64)
        for mb in read_plan(run_dir)["minibatches"]
    }


def plan_dispatch_order(run_dir: str | Path) -> list[tuple[str, ...]]:
    """The prompt ids of each minibatch, in the order the run dispatched them."""
    return [tuple(mb["prompt_ids"]) for mb in read_plan(run_dir)["minibatches"]]


def event_from_json(record: Mapping[str, object]) -> ev.Event:
    """Inverse of ``EventLog.to_json_dict`` (lists come back as tuples)."""
    name = record.get("event")
    kind = EVENT_TYPES.get(str(name))
    if kind is None:
        raise ValueError(f"unknown event type {name!r} in the event log; known: {sorted(EVENT_TYPES)}.")
    names = {f.name for f in fields(kind)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items() if k in names}
    event: ev.Event = kind(**values)
    return event


def read_events(path: str | Path) -> list[ev.Event]:
    """The ``events.jsonl`` the async trainer writes into its run directory."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [event_from_json(json.loads(line)) for line in lines if line.strip()]
