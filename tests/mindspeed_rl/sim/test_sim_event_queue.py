"""The simulator's event heap: time order, then kind, then unit, then insertion."""

from __future__ import annotations

import pytest

from mindspeed_rl.sim.event_queue import EventKind, EventQueue, SimEvent


def _ev(t: float, kind: EventKind, unit: tuple[int, ...], payload: object = None) -> SimEvent:
    return SimEvent(time=t, kind=kind, unit=unit, payload=payload)


def test_simultaneous_events_come_out_in_kind_then_unit_then_insertion_order() -> None:
    q = EventQueue()
    q.push(_ev(5.0, EventKind.GEN_DONE, (1, 0), "gen-1"))
    q.push(_ev(5.0, EventKind.GEN_DONE, (0, 1), "gen-0a"))
    q.push(_ev(5.0, EventKind.TRAIN_DONE, (3,), "train"))
    q.push(_ev(5.0, EventKind.SAVE_DONE, (4,), "save"))
    q.push(_ev(5.0, EventKind.GEN_DONE, (0, 1), "gen-0b"))
    q.push(_ev(5.0, EventKind.LOAD_DONE, (0, 0, 1), "load"))
    q.push(_ev(5.0, EventKind.CONVERT_DONE, (0, 4), "convert"))
    q.push(_ev(2.0, EventKind.GEN_DONE, (9, 9), "early"))
    assert [e.payload for e in q.pop_simultaneous()] == ["early"]
    batch = q.pop_simultaneous()
    assert [e.payload for e in batch] == ["save", "convert", "load", "train", "gen-0a", "gen-0b", "gen-1"]
    assert q.pop_simultaneous() == [] and len(q) == 0


def test_only_equal_times_are_batched() -> None:
    q = EventQueue()
    for t in (1.0, 1.0 + 1e-9, 1.0):
        q.push(_ev(t, EventKind.GEN_DONE, (0, 0)))
    assert len(q.pop_simultaneous()) == 2
    assert [e.time for e in q.pop_simultaneous()] == [1.0 + 1e-9]


@pytest.mark.parametrize("bad", [float("nan"), -1.0])
def test_rejects_bad_times(bad: float) -> None:
    with pytest.raises(ValueError, match="event time"):
        EventQueue().push(_ev(bad, EventKind.GEN_DONE, (0, 0)))
