"""The Ingestor: the one door from generation into the Training Queue.

It accepts a completed minibatch only from the attempt the Database currently has running, so
that a GU or actor declared failed cannot add its samples next to those of the re-issue:

* ``duplicate``  — the minibatch is already completed (e.g. a late reply after the re-issue won);
* ``superseded`` — it comes from an attempt that was failed and re-queued; the re-issue will
  deliver the minibatch instead. Accepting it would need a fresh lag reservation for weights that
  may by now be too old, and would race with the re-issue; dropping it costs one regeneration.

Both are counted and recorded, never silently ignored. Accepted samples are validated (every
prompt of the minibatch, exactly ``n`` samples each, the version the start was granted with),
stamped with the receive time and forwarded with their lag deadline.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import Counter

from mindspeed_rl.runtime.clock import Clock
from mindspeed_rl.runtime.database import Database, InFlight, MinibatchState
from mindspeed_rl.runtime.errors import ProtocolError
from mindspeed_rl.runtime.group_filter import GroupFilter
from mindspeed_rl.runtime.records import CompletedMinibatch, PromptGroup, Sample
from mindspeed_rl.runtime.training_queue import QueueArrival, TrainingQueue


class IngestOutcome(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    SUPERSEDED = "superseded"


class Ingestor:
    def __init__(
        self,
        *,
        database: Database,
        queue: TrainingQueue,
        num_samples_per_prompt: int,
        clock: Clock,
        group_filter: GroupFilter | None = None,
    ) -> None:
        self._db = database
        self.group_filter = group_filter
        self.last_filtered: list[PromptGroup] = []
        """Dynamic sampling: the groups of the latest accepted completion that were dropped."""
        self._queue = queue
        self._n = num_samples_per_prompt
        self._clock = clock
        self.outcomes: Counter[IngestOutcome] = Counter()
        self.received_per_gu: Counter[int] = Counter()

    def receive(
        self, completed: CompletedMinibatch, *, deadline: int | None
    ) -> tuple[IngestOutcome, InFlight | None, QueueArrival | None]:
        """Classify, validate and forward one completion; returns what happened to it."""
        now = self._clock.now()
        state = self._db.state(completed.minibatch_id)
        record = self._db.in_flight(completed.minibatch_id)
        if state is MinibatchState.COMPLETED:
            outcome = IngestOutcome.DUPLICATE
        elif record is None or record.attempt != completed.attempt:
            outcome = IngestOutcome.SUPERSEDED
        elif record.actor_id is None:
            raise ProtocolError(
                f"minibatch {completed.minibatch_id} (attempt {completed.attempt}) was completed without a "
                "granted start; call request_start and generate only when it is granted."
            )
        else:
            outcome = IngestOutcome.ACCEPTED
        arrival = None
        if outcome is IngestOutcome.ACCEPTED:
            assert record is not None
            self._validate(completed, record)
            record = self._db.mark_completed(completed.minibatch_id)
            for sample in completed.samples:
                sample.received_at = now
            arrival = self._queue.put(self._kept(completed), deadline=deadline)
        self.outcomes[outcome] += 1
        self.received_per_gu[completed.gu_id] += 1
        return outcome, (record if outcome is IngestOutcome.ACCEPTED else None), arrival

    def _kept(self, completed: CompletedMinibatch) -> CompletedMinibatch:
        """``completed`` without the groups dynamic sampling drops (all of it when it is off)."""
        self.last_filtered = []
        if self.group_filter is None:
            return completed
        by_prompt: dict[str, list[Sample]] = {}
        for sample in completed.samples:
            by_prompt.setdefault(sample.prompt_id, []).append(sample)
        groups = [
            PromptGroup(prompt_id=p, minibatch_id=completed.minibatch_id, samples=tuple(ss))
            for p, ss in by_prompt.items()
        ]
        kept, self.last_filtered = self.group_filter.split(groups)
        return dataclasses.replace(completed, samples=tuple(s for g in kept for s in g.samples))

    def _validate(self, completed: CompletedMinibatch, record: InFlight) -> None:
        mb = self._db.minibatch(completed.minibatch_id)
        where = f"minibatch {mb.minibatch_id} (attempt {completed.attempt})"
        if (completed.gu_id, completed.actor_id) != (record.gu_id, record.actor_id):
            raise ProtocolError(
                f"{where} returned by GU {completed.gu_id} actor {completed.actor_id} but started on GU "
                f"{record.gu_id} actor {record.actor_id}; return it from the actor that was granted the start."
            )
        if completed.policy_version != record.policy_version:
            raise ProtocolError(
                f"{where} generated with version {completed.policy_version} but its start was granted for "
                f"version {record.policy_version}; request_start with the version the actor will use."
            )
        expected = {(p, i) for p in mb.prompt_ids for i in range(self._n)}
        got = [(s.prompt_id, s.sample_index) for s in completed.samples]
        if len(got) != len(expected) or set(got) != expected:
            missing, extra = sorted(expected - set(got))[:3], sorted(set(got) - expected)[:3]
            raise ProtocolError(
                f"{where} must hold exactly {self._n} samples for each of its {mb.num_prompts} prompts "
                f"(missing {missing}, unexpected {extra}, {len(got)} given); return the whole minibatch."
            )
        for s in completed.samples:
            if s.minibatch_id != mb.minibatch_id or s.policy_version != completed.policy_version:
                raise ProtocolError(
                    f"{where}: sample {s.prompt_id}#{s.sample_index} carries minibatch {s.minibatch_id} / "
                    f"version {s.policy_version}; stamp samples with their minibatch and generating version."
                )
