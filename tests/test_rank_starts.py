"""How ``benchmarks.parity.ranks`` starts gloo ranks: from the preloaded forkserver while the
environment allows it, each rank running in the caller's environment at the call."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.parity import ranks

# What a vLLM engine build, ray.init, inductor and our quiet_logs leave in a long-lived parent.
EXEMPT = (
    "TORCHINDUCTOR_COMPILE_THREADS",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "RAY_AUTH_MODE",
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
    "HF_HUB_DISABLE_PROGRESS_BARS",
)
OTHER = "MINDSPEED_RL_TEST_RANK_VARIABLE"


def _report(rank: int, out: Any) -> None:
    import os

    out.put((rank, tuple(os.environ.get(k) for k in (*EXEMPT, OTHER))))


def _start() -> tuple[str, list[tuple[int, tuple[str | None, ...]]]]:
    ctx = ranks.context()
    method = ctx.get_start_method()
    out = ctx.SimpleQueue()
    ranks.start_ranks(_report, (out,), 2)
    return method, sorted(out.get() for _ in range(2))


def _set(monkeypatch: pytest.MonkeyPatch, value: str) -> tuple[str | None, ...]:
    for key in EXEMPT:
        monkeypatch.setenv(key, value)
    return (*(value,) * len(EXEMPT), None)


def test_variables_set_by_neighbours_keep_the_forkserver_and_reach_the_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a vLLM engine or ray.init left in a long-lived parent must not send every later rank to
    ``spawn``; the forked rank still sees the parent's values at the call, as a spawned one would."""
    monkeypatch.setattr(ranks, "_server_env", None)  # the environment as it is now is the server's
    seen = _set(monkeypatch, "3")
    assert _start() == ("forkserver", [(0, seen), (1, seen)])  # the server is up now
    seen = _set(monkeypatch, "4")
    assert _start() == ("forkserver", [(0, seen), (1, seen)])


def test_any_other_variable_changed_since_the_server_started_spawns_the_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ranks, "_server_env", None)
    ranks.context()
    monkeypatch.setenv(OTHER, "x")
    method, seen = _start()
    assert method == "spawn"
    assert [s[1][-1] for s in seen] == ["x", "x"]
