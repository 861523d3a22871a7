"""The Generation Unit: the control process of a group of generation actors (a threaded Ray actor).

::

    run():  loop until finished / stopped / no actors left
      poll(CU) ─► input queue += assignments;  newest snapshot;  pause signal
      newest snapshot not converted yet? ─► GUConverter.convert ONCE for the whole GU
      for each idle actor:
          behind the converted snapshot? ─► actor.reload(newest)              (deferred reload)
          else, not paused, queue non-empty ─► CU.request_start(head, version the actor holds)
              granted ─► actor.generate_minibatch(head)
              BACKPRESSURE / POLICY_LAG / STALE_WEIGHTS ─► keep head, retry next round
              REVOKED ─► drop head (it was re-issued elsewhere)
      ray.wait(actor futures, timeout) ─► completions to CU; reload timings to CU;
                                          a dead actor ─► CU.on_actor_failed
         (short timeout while an actor is idle; longer while all are busy: nothing but a
          completion can give them work, so polling the CU then only costs CPU)

Reloads only run on idle actors, so they happen between minibatches and always target the newest
snapshot this GU has converted. A dead actor is not replaced: the CU re-issues its minibatch and
the GU carries on with the actors it has left (a GU left without actors is failed by the CU).
The GU itself keeps no authoritative state; if it dies, the CU re-queues everything it held.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mindspeed_rl.runtime.records import Assignment, SnapshotInfo, StartRefusal

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.workers.control_unit import GuPoll

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultPlan:
    """Test-only fault injection: which processes exit, and when (counts are 1-based)."""

    actor_dies: Mapping[tuple[int, int], int] = field(default_factory=dict)
    """(gu_id, actor_id) -> the minibatch during which that actor's process exits."""
    gu_dies: Mapping[int, int] = field(default_factory=dict)
    """gu_id -> the number of forwarded completions after which that GU's process exits."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GuSpec:
    """Everything a GU needs to start its actors."""

    gu_id: int
    config: GRPOConfig
    policy_path: str
    prompts: Mapping[str, PromptRecord]
    num_actors: int
    actor_options: Mapping[str, Any]
    actor_num_cpus: float
    cache_dir: str
    seed: int
    poll_seconds: float = 0.02
    """Loop period while some actor is idle (waiting for work, the pause to lift, or the lag gate)."""
    busy_wait_seconds: float = 0.25
    """Longest wait for a completion while every actor is busy. Each loop round is one CU round
    trip (a few ms of CPU); at 50 Hz that is about a tenth of a core the engines could use. The
    cost of waiting longer: a snapshot published meanwhile is converted up to this much later,
    still long before a minibatch ends and the actor reloads."""
    faults: FaultPlan = field(default_factory=FaultPlan)
    forced_lengths: Mapping[str, tuple[int, ...]] | None = None
    """Trace replay only: each prompt's per-sample response lengths (see GenerationActor)."""


@dataclass(slots=True)
class _Slot:
    actor_id: int
    handle: Any
    version: int = 0
    future: Any = None
    kind: Literal["generate", "reload"] | None = None
    assignment: Assignment | None = None
    rejected_version: int | None = None
    reload_chosen_at: float = 0.0


class GenerationUnit:
    def __init__(self, spec: GuSpec, control: Any) -> None:
        self.spec = spec
        self.gu_id = spec.gu_id
        self._cu = control
        self._queue: deque[Assignment] = deque()
        self._slots: dict[int, _Slot] = {}
        self._stop = threading.Event()
        self._converter: Any = None
        self._converted: SnapshotInfo | None = None
        self._convert_rejected: set[int] = set()
        self.num_forwarded = 0
        self._polled_at = 0.0
        self._cpu_at_start = time.process_time()

    def start_actors(self) -> int:
        """Create the actors, wait until their engines are up, register with the CU."""
        import ray

        from mindspeed_rl.workers.generation_actor import GenerationActor
        from mindspeed_rl.workers.resharding.convert import GUConverter
        from mindspeed_rl.workers.resharding.layout import InferenceLayout

        s = self.spec
        remote = ray.remote(GenerationActor).options(**s.actor_options, max_restarts=0)
        for a in range(s.num_actors):
            handle = remote.remote(
                s.config,
                s.policy_path,
                s.prompts,
                gu_id=self.gu_id,
                actor_id=a,
                num_cpus=s.actor_num_cpus,
                seed=s.seed + 1000 * self.gu_id + a,
                die_on_minibatch=s.faults.actor_dies.get((self.gu_id, a)),
                forced_lengths=s.forced_lengths,
            )
            self._slots[a] = _Slot(actor_id=a, handle=handle)
        ray.get([slot.handle.__ray_ready__.remote() for slot in self._slots.values()])
        # The torch backend's inference layout is one full replica per actor (TP = EP = 1).
        self._converter = GUConverter(Path(s.cache_dir), InferenceLayout(), num_threads=1)
        ray.get(self._cu.register_gu.remote(self.gu_id, len(self._slots)))
        return len(self._slots)

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> dict[str, int]:
        """The control loop; returns counts when the run is finished, stopped or out of actors."""
        import ray

        while not self._stop.is_set() and self._slots:
            # Taken before the poll: every snapshot published by now is in the answer.
            self._polled_at = time.time()
            poll: GuPoll = ray.get(self._cu.poll.remote(self.gu_id))
            if not poll.gu_known or poll.finished:
                break
            self._queue.extend(poll.assignments)
            self._convert(poll.latest_snapshot)
            self._start_work(paused=poll.paused)
            all_busy = all(slot.future is not None for slot in self._slots.values())
            self._collect(timeout=self.spec.busy_wait_seconds if all_busy else self.spec.poll_seconds)
        return {"forwarded": self.num_forwarded, "actors_alive": len(self._slots)}

    def cpu_seconds(self) -> float:
        """CPU time of this control process (all its threads, Ray's included) since it started."""
        return time.process_time() - self._cpu_at_start

    def shutdown(self) -> None:
        import ray

        for slot in self._slots.values():
            ray.kill(slot.handle)
        self._slots.clear()

    # ---- weight flow -----------------------------------------------------------------------------
    def _convert(self, latest: SnapshotInfo | None) -> None:
        import ray

        from mindspeed_rl.workers.resharding.manifest import SnapshotError
        from mindspeed_rl.workers.resharding.manifest import SnapshotInfo as StoredSnapshot

        if latest is None or latest.version in self._convert_rejected:
            return
        if self._converted is not None and latest.version <= self._converted.version:
            return
        try:
            result = self._converter.convert(StoredSnapshot(version=latest.version, path=Path(latest.path)))
        except SnapshotError as err:  # GUConverter has logged it; actors keep their weights
            logger.error(
                "GU %d: snapshot v%d rejected (%s); actors keep their weights",
                self.gu_id,
                latest.version,
                err,
            )
            self._convert_rejected.add(latest.version)
            return
        self._converted = SnapshotInfo(
            version=result.version, path=str(result.converted.path), created_at=time.time()
        )
        ray.get(self._cu.on_snapshot_converted.remote(self.gu_id, result.version, result.total_seconds))

    # ---- starting work -----------------------------------------------------------------------------
    def _start_work(self, *, paused: bool) -> None:
        can_start = not paused
        for slot in list(self._slots.values()):
            if slot.future is not None:
                continue
            target = self._converted
            if (
                target is not None
                and target.version > slot.version
                and target.version != slot.rejected_version
            ):
                slot.kind, slot.future = "reload", slot.handle.reload.remote(target.path, target.version)
                slot.reload_chosen_at = self._polled_at
            elif can_start:
                can_start = self._start_next(slot)

    def _start_next(self, slot: _Slot) -> bool:
        """Start the head of the input queue on ``slot``; False when starting must wait."""
        import ray

        while self._queue:
            head = self._queue[0]
            decision = ray.get(
                self._cu.request_start.remote(
                    head.minibatch.minibatch_id,
                    attempt=head.attempt,
                    gu_id=self.gu_id,
                    actor_id=slot.actor_id,
                    policy_version=slot.version,
                )
            )
            if decision.granted:
                self._queue.popleft()
                slot.kind, slot.assignment = "generate", head
                slot.future = slot.handle.generate_minibatch.remote(
                    head.minibatch, attempt=head.attempt, sent_at=head.issued_at
                )
                return True
            if decision.refusal is StartRefusal.REVOKED:
                self._queue.popleft()
                logger.info("GU %d: minibatch %d revoked", self.gu_id, head.minibatch.minibatch_id)
                continue
            return False  # backpressure or lag: the same answer holds for every idle actor now
        return True

    # ---- completions -------------------------------------------------------------------------------
    def _collect(self, *, timeout: float) -> None:
        import ray

        busy = {slot.future: slot for slot in self._slots.values() if slot.future is not None}
        if not busy:
            time.sleep(timeout)
            return
        ready, _ = ray.wait(list(busy), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(list(busy), num_returns=len(busy), timeout=0)
        for ref in ready:
            self._finish(busy[ref], ref)

    def _finish(self, slot: _Slot, ref: Any) -> None:
        import ray

        kind, assignment = slot.kind, slot.assignment
        slot.future, slot.kind, slot.assignment = None, None, None
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError:
            what = f"minibatch {assignment.minibatch.minibatch_id}" if assignment else kind
            logger.error("GU %d: actor %d died during %s", self.gu_id, slot.actor_id, what)
            del self._slots[slot.actor_id]
            ray.get(self._cu.on_actor_failed.remote(self.gu_id, slot.actor_id))
            return
        if kind == "reload":
            self._on_reloaded(slot, result)
            return
        ray.get(self._cu.on_minibatch_completed.remote(result))
        self.num_forwarded += 1
        if self.spec.faults.gu_dies.get(self.gu_id) == self.num_forwarded:
            logger.error("fault injection: GU %d exits", self.gu_id)
            os._exit(1)

    def _on_reloaded(self, slot: _Slot, result: Any) -> None:
        import ray

        if result.status == "loaded":
            slot.version = result.version
            ray.get(
                self._cu.on_weights_loaded.remote(
                    self.gu_id, slot.actor_id, result.version, result.load_seconds, slot.reload_chosen_at
                )
            )
        elif result.status == "rejected":
            slot.rejected_version = result.target_version
            logger.error(
                "GU %d actor %d rejected snapshot v%s: %s",
                self.gu_id,
                slot.actor_id,
                result.target_version,
                result.reason,
            )
