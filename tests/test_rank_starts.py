"""How ``benchmarks.parity.ranks`` starts gloo ranks: from the preloaded forkserver while the
environment allows it, each rank running in the caller's environment at the call."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.parity import ranks

EXEMPT = "TORCHINDUCTOR_COMPILE_THREADS"  # importing vLLM sets it to 1
OTHER = "MINDSPEED_RL_TEST_RANK_VARIABLE"


def _report(rank: int, out: Any) -> None:
    import os

    out.put((rank, os.environ.get(EXEMPT), os.environ.get(OTHER)))


def _start(monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[tuple[int, str | None, str | None]]]:
    ctx = ranks.context()
    method = ctx.get_start_method()
    out = ctx.SimpleQueue()
    ranks.start_ranks(_report, (out,), 2)
    seen = sorted(out.get() for _ in range(2))
    return method, seen


def test_a_variable_set_by_a_neighbour_keeps_the_forkserver_and_reaches_the_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a vLLM import or ray.init left in a long-lived parent must not send every later rank to
    ``spawn``; the forked rank still sees the parent's value at the call, as a spawned one would."""
    monkeypatch.setattr(ranks, "_server_env", None)  # the environment as it is now is the server's
    monkeypatch.setenv(EXEMPT, "3")
    assert _start(monkeypatch) == ("forkserver", [(0, "3", None), (1, "3", None)])  # the server is up
    monkeypatch.setenv(EXEMPT, "4")
    assert _start(monkeypatch) == ("forkserver", [(0, "4", None), (1, "4", None)])


def test_any_other_variable_changed_since_the_server_started_spawns_the_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ranks, "_server_env", None)
    ranks.context()
    monkeypatch.setenv(OTHER, "x")
    method, seen = _start(monkeypatch)
    assert method == "spawn"
    assert [s[2] for s in seen] == ["x", "x"]
