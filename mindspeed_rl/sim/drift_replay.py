"""Trace replay under length drift: the real async pipeline, C4 offline vs C4 online.

The simulator's comparison (``sim.online``) on the real Control Unit, Generation Units, vLLM
actors, Training Queue and weight refresh, with the replay's two substitutions (``sim.replay``):
forced lengths and a fixed-sleep trainer step. What changes against a plain replay:

* two epochs of the trace (``drift.two_epochs``); epoch 2's prompts are scheduled as the run
  itself aliases a later pass (``q17@1``, ``datasets.prompt_alias``), so online ASP's per-prompt
  history links them exactly as in a training run;
* each sample's forced length is the drift model's at the weights that generate it
  (:class:`DriftedLengths`: ``policy_version / num_steps`` is the run progress), so a minibatch
  dispatched later decodes the drifted length, whatever order the schedule gives it;
* both runs start from the same per-epoch C4 schedule on the same noisy-oracle predictions
  (``sim.online.offline_two_epoch_schedule``); the online run turns on ``asp_config.online``
  and takes those predictions as its prior.

Group-load CV comes from the run's ``events.jsonl``: each minibatch's batch group as it was
issued and its generated tokens as accepted, through the simulator's ``block_cv_of``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from mindspeed_rl.datasets.prompt_alias import pass_alias
from mindspeed_rl.runtime import events as ev
from mindspeed_rl.sim.drift import DriftModel, DriftParams, epoch_of, prompt_key, two_epochs
from mindspeed_rl.sim.online import block_cv_of, offline_two_epoch_schedule
from mindspeed_rl.sim.replay import synthetic_prompts

if TYPE_CHECKING:
    from asp_scheduler.params import ScheduleParams
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.runtime.records import ScheduledMinibatch
    from mindspeed_rl.sim.workload import Workload


@dataclass(frozen=True, slots=True)
class DriftedLengths:
    """A ``workers.forced_lengths.LengthPlan``: a prompt's forced lengths at a policy version."""

    model: DriftModel
    rows: Mapping[str, int]
    """Replay prompt id -> its row of the model's (two-epoch) workload."""
    num_steps: int
    """Trainer steps of the run: progress = policy_version / num_steps."""

    def lengths(self, prompt_id: str, policy_version: int) -> tuple[int, ...]:
        row = self.rows.get(prompt_id)
        if row is None:
            raise ValueError(f"no drifted lengths for prompt {prompt_id!r}; it is not in the replayed trace")
        drawn = self.model.lengths([row], policy_version / self.num_steps)[0]
        return tuple(int(x) for x in drawn)


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftReplayPlan:
    drift: str
    prompts: tuple[PromptRecord, ...]
    schedule: tuple[ScheduledMinibatch, ...]
    lengths: DriftedLengths
    predictions: dict[str, float]
    """Offline prediction per replay prompt id (the online run's prior)."""
    measured_tau: float


def replay_id(two_epoch_id: str) -> str:
    """``s5#e0`` -> ``s5``, ``s5#e1`` -> ``s5@1``: a later epoch as the run aliases a later pass."""
    return pass_alias(prompt_key(two_epoch_id), epoch_of(two_epoch_id))


def build_drift_plan(
    base: Workload,
    params: ScheduleParams,
    *,
    drift: str,
    tau: float,
    global_batch: int,
    drift_params: DriftParams,
    prompt_tokens: int,
    vocab_size: int,
) -> DriftReplayPlan:
    """The two-epoch replay of ``base`` under ``drift`` (``params.seed`` seeds everything)."""
    from asp_scheduler.predictors.noisy_oracle import noisy_oracle_predictions

    seed = params.seed
    workload = two_epochs(base, seed=seed, resample_sigma=drift_params.resample_sigma)
    if workload.num_prompts % global_batch:
        raise ValueError(
            f"two epochs of {base.num_prompts} prompts do not fill global batches of {global_batch}; "
            "pass a number of prompts per epoch that global_batch divides"
        )
    ids = tuple(replay_id(p) for p in workload.prompt_ids)
    oracle = noisy_oracle_predictions(base.prompt_lengths, tau, seed)
    schedule = offline_two_epoch_schedule(replace(workload, prompt_ids=ids), oracle.predictions, params)
    predicted = oracle.predictions.tolist()
    return DriftReplayPlan(
        drift=drift,
        prompts=synthetic_prompts(ids, num_tokens=prompt_tokens, vocab_size=vocab_size),
        schedule=tuple(schedule),
        lengths=DriftedLengths(
            model=DriftModel(drift, workload, drift_params, seed=seed),
            rows={pid: row for row, pid in enumerate(ids)},
            num_steps=workload.num_prompts // global_batch,
        ),
        predictions={pid: float(predicted[row % base.num_prompts]) for row, pid in enumerate(ids)},
        measured_tau=oracle.measured_tau,
    )


def group_cv_from_events(events: Sequence[ev.Event], *, k: int, block: int) -> dict[str, float]:
    """Measured in-block group-load CV of a replayed run (the simulator's definition)."""
    issued: dict[int, tuple[int, int]] = {}  # minibatch -> (position, batch group) at first issue
    tokens: dict[int, float] = {}
    for e in events:
        if isinstance(e, ev.MinibatchIssued) and e.minibatch_id not in issued:
            issued[e.minibatch_id] = (len(issued), e.batch_group_id)
        elif isinstance(e, ev.MinibatchReceived) and e.outcome == "accepted":
            tokens[e.minibatch_id] = float(e.num_response_tokens)
    missing = sorted(set(tokens) - set(issued))
    if missing:
        raise ValueError(
            f"minibatches {missing[:3]} were accepted but never issued; pass the whole event log"
        )
    rows = [(group, position, tokens[mb], 0.0) for mb, (position, group) in issued.items() if mb in tokens]
    return block_cv_of(rows, k, block)
