"""The suite's two streams under ``-n 2 --dist loadscope`` (``conftest.py``): which files run in the
serial e2e stream, and which unit a free worker takes first."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REST_PATHS, TESTS, scope_of, scope_rank, stream_of
from tests.support.suite_durations import PhaseTime, summarize

ROOT = TESTS.parent
TRAINER = TESTS / "mindspeed_rl" / "trainer"
# The session-scoped shared runs (tests/mindspeed_rl/trainer/conftest.py): each is made once per
# worker that asks for it, so every file reading one must run in the one e2e stream.
SHARED_RUNS = ("hybrid_run", "tp2_tied_run", "partial_qwen25_run")


def test_cli_run_files_are_in_the_e2e_stream_and_unit_files_beside_them_are_not() -> None:
    assert stream_of(TRAINER / "test_async_e2e.py") == "e2e"
    assert scope_of("tests/mindspeed_rl/trainer/test_async_e2e.py", ROOT) == "e2e"
    assert stream_of(TESTS / "mindspeed_rl" / "test_launcher.py") == "e2e"
    # Unit tests in the same folders (no integration mark) run with the rest, each file a unit.
    for unit in (TRAINER / "test_prompts.py", TESTS / "cli" / "test_simulate.py"):
        assert stream_of(unit) == "rest"
        file = str(unit.relative_to(ROOT))
        assert scope_of(file, ROOT) == file
    # Outside the e2e paths nothing joins the stream, marked or not.
    assert stream_of(TESTS / "mindspeed_rl" / "models" / "training" / "test_device_check.py") == "rest"


def test_every_file_reading_a_shared_run_is_in_the_e2e_stream() -> None:
    readers = [
        path
        for path in sorted(TESTS.rglob("test_*.py"))
        if path != Path(__file__).resolve()
        if any(re.search(rf"\b{name}\b", path.read_text()) for name in SHARED_RUNS)
    ]
    assert len(readers) >= 5  # hybrid, periodic eval, resume, TP2 actor, real checkpoints, async
    assert [p for p in readers if stream_of(p) != "e2e"] == []


def test_a_free_worker_takes_the_e2e_stream_then_the_long_rest_files_first() -> None:
    long_rest = str(REST_PATHS[0].relative_to(ROOT))
    unit = str((TRAINER / "test_prompts.py").relative_to(ROOT))
    assert stream_of(REST_PATHS[0]) == "rest" and scope_of(long_rest, ROOT) == long_rest
    ranked = sorted([unit, long_rest, "e2e"], key=lambda scope: scope_rank(scope, ROOT))
    assert ranked == ["e2e", long_rest, unit]


def test_stream_durations_sum_each_stream_and_worker_and_list_the_slowest() -> None:
    e2e, unit = "tests/mindspeed_rl/trainer/test_async_e2e.py::t", "tests/cli/test_simulate.py::t"
    phases = [
        PhaseTime(nodeid=e2e, when="setup", seconds=30.0, worker="gw0"),
        PhaseTime(nodeid=e2e, when="call", seconds=1.5, worker="gw0"),
        PhaseTime(nodeid=unit, when="call", seconds=2.25, worker="gw1"),
        PhaseTime(nodeid=unit + "2", when="call", seconds=0.5, worker="gw0"),
    ]
    summary = summarize(phases, lambda nodeid: stream_of(ROOT / nodeid.split("::", 1)[0]))
    assert summary["seconds_per_stream"] == {"e2e": 31.5, "rest": 2.75}
    assert summary["tests_per_stream"] == {"e2e": 1, "rest": 2}
    assert summary["seconds_per_worker"] == {"gw0": 32.0, "gw1": 2.25}
    assert list(summary["seconds_per_file"].items()) == [
        ("tests/mindspeed_rl/trainer/test_async_e2e.py", 31.5),
        ("tests/cli/test_simulate.py", 2.75),
    ]
    assert [(p["nodeid"], p["when"]) for p in summary["slowest"]] == [
        (e2e, "setup"),
        (unit, "call"),
        (e2e, "call"),
        (unit + "2", "call"),
    ]
