"""Typed records that cross process boundaries (CU ⇄ GU ⇄ Training Queue ⇄ TU).

Plain frozen dataclasses of builtins only, so Ray can pickle them and the simulator can build
them without any engine. Conventions used everywhere in the runtime:

* ``policy_version`` counts completed optimizer steps: the initial weights are version 0 and
  the snapshot exported after trainer step ``s`` (0-based) is version ``s + 1``.
* A trainer step ``s`` consumes one global batch; the off-policy distance of a sample consumed
  there is ``d_off = s - policy_version`` (0 for a strictly on-policy loop).
* ``gu_id`` names a Generation Unit; ``actor_id`` names a generation actor *within* its GU.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindspeed_rl.runtime.segments import TokenSegment, check_aligned

if TYPE_CHECKING:
    from mindspeed_rl.runtime.group_filter import StepFilterStats
    from mindspeed_rl.runtime.routing import Routing


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduledMinibatch:
    """One unit of rollout work from the ASP schedule: prompts decoded together by one actor."""

    minibatch_id: int
    prompt_ids: tuple[str, ...]
    batch_group_id: int
    predicted_load: float
    """Sum of the predicted output lengths of the minibatch's prompts (tokens)."""
    order_index: int
    """Position in the precomputed dispatch order (0 = first to send)."""
    reserve: bool = False
    """DAPO over-sampling: held back until dynamic sampling has filtered enough groups that the
    run needs more prompts (``ControlLoop`` releases it a batch group at a time)."""

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(
                f"minibatch {self.minibatch_id} has no prompts; drop empty minibatches upstream."
            )
        if len(set(self.prompt_ids)) != len(self.prompt_ids):
            raise ValueError(
                f"minibatch {self.minibatch_id} lists a prompt twice; each prompt belongs to one slot."
            )

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_ids)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolUse:
    """What a multi-turn trajectory did with its tools (``tools.agent_loop.TrajectoryStats``)."""

    turns: int
    calls: int
    errors: int
    truncated: int
    """Tool responses cut to ``max_tool_response_length``."""
    seconds: float
    """Wall-clock seconds of its tool calls, summed over calls."""


@dataclass(slots=True, kw_only=True)
class Sample:
    """One prompt–response trajectory with everything needed to train on it and to audit lag.

    Not frozen, unlike the other records: the Ingestor stamps ``received_at`` in place, because a
    frozen copy per sample cost more than the rest of the control loop put together."""

    prompt_id: str
    sample_index: int
    """Which of the ``n_samples_per_prompt`` responses of this prompt (0-based)."""
    minibatch_id: int
    response_token_ids: tuple[int, ...]
    rollout_log_probs: tuple[float, ...]
    """Per-token log-probabilities under the generating policy, aligned with the tokens."""
    reward: float | None
    policy_version: int
    gu_id: int
    actor_id: int
    sent_at: float
    """When the CU issued the minibatch that produced this sample."""
    received_at: float | None = None
    """When the Ingestor accepted it; set by the CU, ``None`` until then."""
    finish_reason: str = "stop"
    filter_score: float | None = None
    """Dynamic sampling (DAPO): the filter metric's score, set by the generation actor; a group
    whose scores are all equal is dropped before the Training Queue (``runtime.group_filter``)."""
    segments: tuple[TokenSegment, ...] = ()
    """Partial rollouts: the versions that produced the response, oldest first, when it crossed
    a weight refresh; empty when every token is ``policy_version``'s. ``policy_version`` is the
    oldest token's version, so the lag bound and ``d_off`` count from it."""
    loss_mask: tuple[int, ...] = ()
    """Multi-turn rollouts: 1 for each token the policy generated, 0 for tool-response tokens
    (kept in the context, excluded from every loss term); empty = all the policy's."""
    tool_use: ToolUse | None = None
    """Multi-turn rollouts: its tool calls, for the per-iteration ``tools/*`` metrics."""
    routing: Routing | None = None
    """MoE routing replay (``rl_config.routing_replay: R3``): the experts the rollout engine chose
    for every prompt and response position (``runtime.routing``); with partial rollouts each
    segment's positions carry the routing of the version that decoded them. None: not recorded."""

    def __post_init__(self) -> None:
        if len(self.rollout_log_probs) != len(self.response_token_ids):
            raise ValueError(
                f"sample {self.prompt_id}#{self.sample_index}: {len(self.rollout_log_probs)} log-probs for "
                f"{len(self.response_token_ids)} tokens; the engine must return one log-prob per token."
            )
        if self.loss_mask and (
            len(self.loss_mask) != len(self.response_token_ids) or not set(self.loss_mask) <= {0, 1}
        ):
            raise ValueError(
                f"sample {self.prompt_id}#{self.sample_index}: loss_mask must hold one 0/1 per response token "
                f"({len(self.loss_mask)} values for {len(self.response_token_ids)} tokens)"
            )
        if self.segments:
            check_aligned(self.segments, len(self.response_token_ids))
            if self.segments[0].version != self.policy_version:
                raise ValueError(
                    f"sample {self.prompt_id}#{self.sample_index}: policy_version {self.policy_version} but its "
                    f"oldest token is from version {self.segments[0].version}; they must be the same"
                )

    @property
    def routing_bytes(self) -> int:
        return 0 if self.routing is None else self.routing.nbytes

    @property
    def num_segments(self) -> int:
        return max(1, len(self.segments))


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletedMinibatch:
    """All samples of one minibatch, returned by an actor only when the whole minibatch is done."""

    minibatch_id: int
    attempt: int
    """Which issue of the minibatch produced this (copied from the ``Assignment``)."""
    samples: tuple[Sample, ...]
    gu_id: int
    actor_id: int
    policy_version: int
    """The version the start was granted for: every sample's oldest token is from it."""
    started_at: float
    finished_at: float
    reload_seconds: float = 0.0
    """Partial rollouts: time spent reloading weights inside the minibatch (not generation)."""

    @property
    def generation_seconds(self) -> float:
        return self.finished_at - self.started_at - self.reload_seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptGroup:
    """The ``n`` samples of one prompt; never split across minibatches or global batches."""

    prompt_id: str
    minibatch_id: int
    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class GlobalBatch:
    """The prompts consumed by one trainer step."""

    step: int
    prompts: tuple[PromptGroup, ...]
    filtered_prompt_ids: tuple[str, ...] = ()
    """Dynamic sampling: prompts dropped (no spread) since the previous step; consumed, not trained."""
    gen_batches: int = 1
    """Dynamic sampling: generation batches this step's kept + filtered prompts make."""
    records: tuple[Any, ...] = ()
    """A streaming schedule: the trained prompts' records (as ``Assignment.records``)."""

    @property
    def num_prompts(self) -> int:
        return len(self.prompts)

    @property
    def consumed_prompt_ids(self) -> tuple[str, ...]:
        """Every prompt this step consumed: trained, then dropped by dynamic sampling."""
        return self.prompt_ids + self.filtered_prompt_ids

    def with_filter_stats(self, stats: StepFilterStats) -> GlobalBatch:
        return GlobalBatch(
            step=self.step,
            prompts=self.prompts,
            filtered_prompt_ids=stats.filtered_prompt_ids,
            gen_batches=stats.gen_batches,
            records=self.records,
        )

    def filter_metrics(self) -> dict[str, float]:
        return {
            "dapo/groups_kept": float(self.num_prompts),
            "dapo/groups_filtered": float(len(self.filtered_prompt_ids)),
            "dapo/gen_batches": float(self.gen_batches),
        }

    @property
    def num_samples(self) -> int:
        return sum(len(p.samples) for p in self.prompts)

    @property
    def prompt_ids(self) -> tuple[str, ...]:
        return tuple(p.prompt_id for p in self.prompts)

    @property
    def samples(self) -> tuple[Sample, ...]:
        return tuple(s for p in self.prompts for s in p.samples)


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotInfo:
    """A published weight snapshot that generation actors may load."""

    version: int
    path: str
    created_at: float
    handle: Any = None
    """``weight_transport`` object_store / collective: the in-memory snapshot record
    (``weights.memory_snapshot.MemorySnapshot``; ``path`` then names the version only); None for files."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Assignment:
    """The CU's instruction to put a minibatch into one GU's input queue."""

    gu_id: int
    minibatch: ScheduledMinibatch
    attempt: int
    """0 for the first issue, incremented at every re-issue after a failure."""
    issued_at: float
    records: tuple[Any, ...] = ()
    """A streaming schedule (``asp_config.window``): the minibatch's prompt records
    (``datasets.PromptRecord``), since no actor holds a table of prompts drawn after it started;
    empty: the actor's table has them."""


class StartRefusal(enum.Enum):
    """Why the CU refused to let a GU start a minibatch now."""

    BACKPRESSURE = "backpressure"
    """The Training Queue is over its limit; retry after the pause signal clears."""
    POLICY_LAG = "policy_lag"
    """Starting now could exceed ``max_policy_lag``; retry after a trainer step or a reload."""
    STALE_WEIGHTS = "stale_weights"
    """The actor's weights are too old to ever meet the lag bound; reload the newest snapshot."""
    REVOKED = "revoked"
    """The minibatch is no longer this GU's (it was re-issued elsewhere); drop it from the queue."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StartDecision:
    granted: bool
    refusal: StartRefusal | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GuSignals:
    """The part of the CU's state every GU acts on; a change may let a waiting GU start work."""

    latest_version: int
    """Newest published snapshot (0: the initial weights)."""
    paused: bool
    """Backpressure forbids starts."""
    finished: bool
    """Every scheduled prompt has been consumed."""
    train_steps: int
    """Global batches taken by the trainer: each one frees lag budget (``POLICY_LAG`` waits on it)."""
