"""Bookkeeping of the weight flow as the CU sees it: which snapshot is newest, what each export,
conversion and reload cost, and whether reloads always picked the newest snapshot.

Moving the bytes is the workers' job (``mindspeed_rl.weights``); this only records.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from mindspeed_rl.runtime import events as ev
from mindspeed_rl.runtime.clock import Clock
from mindspeed_rl.runtime.errors import ProtocolError
from mindspeed_rl.runtime.records import SnapshotInfo
from mindspeed_rl.runtime.timings import ActorActivityLog, TimingStats


class WeightFlowLedger:
    def __init__(
        self, *, timings: TimingStats, activity: ActorActivityLog, events: ev.EventLog, clock: Clock
    ) -> None:
        self._timings, self._activity, self._events, self._clock = timings, activity, events, clock
        self.latest: SnapshotInfo | None = None
        """The snapshot actors should reload to before their next minibatch (``None``: initial weights)."""
        self.reloads_not_newest = 0
        # Publication times and versions, both increasing: newest_at is a binary search.
        self._published_at: list[float] = []
        self._versions: list[int] = []

    @property
    def latest_version(self) -> int:
        return 0 if self.latest is None else self.latest.version

    def published(self, snapshot: SnapshotInfo, *, save_seconds: float | None, steps_done: int) -> None:
        if not self.latest_version < snapshot.version <= steps_done:
            raise ValueError(
                f"snapshot version {snapshot.version} must be newer than {self.latest_version} and at most the "
                f"number of finished trainer steps ({steps_done}); a snapshot's version is the steps it has seen."
            )
        self.latest = snapshot
        # Kept sorted even if the wall clock steps back (NTP): never earlier than the previous one.
        self._published_at.append(
            max(self._clock.now(), self._published_at[-1] if self._published_at else 0.0)
        )
        self._versions.append(snapshot.version)
        if save_seconds is not None:
            self._timings.save.add(save_seconds)
        self._events.append(
            ev.SnapshotPublished(
                time=self._clock.now(),
                version=snapshot.version,
                path=snapshot.path,
                save_seconds=save_seconds,
            )
        )

    def converted(
        self,
        gu_id: int,
        version: int,
        seconds: float,
        *,
        at: float | None = None,
        delta: Mapping[str, float] | None = None,
    ) -> None:
        """``at``: when the conversion ended, if the GU reports it later than that (clock time)."""
        self._timings.convert.add(seconds)
        self._events.append(
            ev.SnapshotConverted(
                time=self._clock.now() if at is None else at,
                gu_id=gu_id,
                version=version,
                seconds=seconds,
                delta=None if delta is None else dict(delta),
            )
        )

    def newest_at(self, time: float) -> int:
        """The newest version published at or before ``time`` (0: the initial weights)."""
        i = bisect.bisect_right(self._published_at, time)
        return self._versions[i - 1] if i else 0

    def loaded(
        self, gu_id: int, actor_id: int, version: int, seconds: float, *, started_at: float | None = None
    ) -> None:
        """Record a finished reload. With ``started_at`` (when the GU chose the target) the reload is
        judged against the newest snapshot published by then: a snapshot published while a reload
        is already under way is not a violation, the next reload picks it up."""
        if version > self.latest_version:
            raise ProtocolError(
                f"actor {gu_id}/{actor_id} loaded version {version}, but only {self.latest_version} is "
                "published; report the version of the snapshot actually loaded."
            )
        newest = self.latest_version if started_at is None else self.newest_at(started_at)
        self.reloads_not_newest += version < newest
        now = self._clock.now()
        self._timings.load.add(seconds)
        self._activity.on_loaded(gu_id, actor_id, seconds=seconds, finished_at=now)
        self._events.append(
            ev.WeightsLoaded(
                time=now,
                gu_id=gu_id,
                actor_id=actor_id,
                version=version,
                seconds=seconds,
                newest_published=self.latest_version,
                newest_at_start=newest,
            )
        )
