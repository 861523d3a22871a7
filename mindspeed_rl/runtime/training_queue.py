"""The Training Queue: completed samples waiting for the trainer, kept as whole prompts.

Samples enter a minibatch at a time and leave a global batch at a time; in between they are
held per prompt, so a prompt's ``n`` samples can never be split. Global batches take prompts
earliest-deadline-first (see ``lag_budget``), which is plain arrival order when no lag bound is
set. The queue is bounded by backpressure, not by refusing arrivals: refusing would lose work
that has already been paid for, so depth is recorded at every arrival instead.

No lock here: the queue is one part of the ``ControlLoop``, which serializes all calls.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from mindspeed_rl.runtime.append_log import AppendLog
from mindspeed_rl.runtime.clock import Clock
from mindspeed_rl.runtime.records import CompletedMinibatch, GlobalBatch, PromptGroup, Sample


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueArrival:
    """The queue as one completed minibatch found and left it."""

    time: float
    minibatch_id: int
    gu_id: int
    actor_id: int
    num_samples: int
    depth_samples_before: int
    depth_samples_after: int
    depth_global_batches_before: float
    """``Q_arrival`` of Eq. 4: queued prompts ÷ prompts per global batch, before insertion."""
    routing_bytes_after: int = 0
    """MoE routing replay (R3): the routing records the queue held after the insertion, in bytes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedPrompt:
    group: PromptGroup
    deadline: int | None
    arrival_seq: int

    @property
    def priority(self) -> tuple[int, int]:
        return (sys.maxsize if self.deadline is None else self.deadline, self.arrival_seq)


class TrainingQueue:
    def __init__(self, *, num_prompts_per_global_batch: int, clock: Clock) -> None:
        self.num_prompts_per_global_batch = num_prompts_per_global_batch
        self._clock = clock
        self._prompts: dict[str, QueuedPrompt] = {}
        self._depth_samples = 0
        self._seq = 0
        self.arrivals: AppendLog[QueueArrival] = AppendLog()
        """One record per put; the Control Unit trims what its per-step digest has read."""
        self.max_depth_samples = 0
        # MoE routing replay (R3): the routing records riding with the queued samples. Counted
        # because they are the queue's one per-token payload besides the token ids themselves
        # (layers x top-k bytes per token), so the queue bound also bounds this memory.
        self._routing_bytes = 0
        self.max_routing_bytes = 0
        self.samples_taken = 0
        self.routing_bytes_taken = 0

    @property
    def depth_samples(self) -> int:
        return self._depth_samples

    @property
    def routing_bytes(self) -> int:
        """Bytes of MoE routing records the queued samples carry (0 without routing replay)."""
        return self._routing_bytes

    @property
    def depth_prompts(self) -> int:
        return len(self._prompts)

    @property
    def depth_global_batches(self) -> float:
        return len(self._prompts) / self.num_prompts_per_global_batch

    def put(self, completed: CompletedMinibatch, *, deadline: int | None) -> QueueArrival:
        """Add a completed minibatch's samples, grouped by prompt, and record the arrival."""
        by_prompt: dict[str, list[Sample]] = {}
        for sample in completed.samples:
            by_prompt.setdefault(sample.prompt_id, []).append(sample)
        clash = [p for p in by_prompt if p in self._prompts]
        if clash:
            raise ValueError(
                f"prompt(s) {clash[:3]} are already queued; a prompt's samples must arrive in one minibatch."
            )
        before, before_batches = self._depth_samples, self.depth_global_batches
        for prompt_id, samples in by_prompt.items():
            group = PromptGroup(
                prompt_id=prompt_id, minibatch_id=completed.minibatch_id, samples=tuple(samples)
            )
            self._prompts[prompt_id] = QueuedPrompt(group=group, deadline=deadline, arrival_seq=self._seq)
            self._seq += 1
        self._depth_samples += len(completed.samples)
        self.max_depth_samples = max(self.max_depth_samples, self._depth_samples)
        self._routing_bytes += sum(s.routing_bytes for s in completed.samples)
        self.max_routing_bytes = max(self.max_routing_bytes, self._routing_bytes)
        arrival = QueueArrival(
            time=self._clock.now(),
            minibatch_id=completed.minibatch_id,
            gu_id=completed.gu_id,
            actor_id=completed.actor_id,
            num_samples=len(completed.samples),
            depth_samples_before=before,
            depth_samples_after=self._depth_samples,
            depth_global_batches_before=before_batches,
            routing_bytes_after=self._routing_bytes,
        )
        self.arrivals.append(arrival)
        return arrival

    def candidates(self, num_prompts: int) -> list[QueuedPrompt]:
        """The prompts the next global batch would take, highest priority first (not removed)."""
        return heapq.nsmallest(num_prompts, self._prompts.values(), key=lambda q: q.priority)

    def take(self, prompts: Sequence[QueuedPrompt], *, step: int) -> GlobalBatch:
        for queued in prompts:
            del self._prompts[queued.group.prompt_id]
            self._depth_samples -= len(queued.group.samples)
            routing = sum(s.routing_bytes for s in queued.group.samples)
            self._routing_bytes -= routing
            self.routing_bytes_taken += routing
            self.samples_taken += len(queued.group.samples)
        return GlobalBatch(step=step, prompts=tuple(q.group for q in prompts))

    def pop_global_batch(
        self, num_prompts: int, *, step: int, allow_partial: bool = False
    ) -> GlobalBatch | None:
        """Take ``num_prompts`` whole prompts, or ``None`` if fewer are queued.

        ``allow_partial`` lets the last batch of a run be smaller instead of dropping its prompts.
        """
        if num_prompts < 1:
            raise ValueError(f"a global batch needs at least one prompt, got num_prompts={num_prompts}.")
        if not self._prompts or (len(self._prompts) < num_prompts and not allow_partial):
            return None
        return self.take(self.candidates(num_prompts), step=step)
