"""Fixtures every test package may use, and the suite's two streams under pytest-xdist."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.support.models import PolicyModels

TESTS = Path(__file__).resolve().parent
# The end-to-end stream: CLI runs (Ray, engines, the launcher), one at a time. Measured on 2 cores,
# each keeps about 1.2 cores busy on average (start-up chains, hang timeouts, engine waits), so the
# other worker runs the rest of the suite alongside (``make test``: -n 2 --dist loadscope). A file
# under these paths joins the stream only if it marks tests ``integration`` (real Ray, real engines:
# every CLI-run file does): the unit tests beside them run with the rest.
E2E_PATHS = (TESTS / "mindspeed_rl" / "trainer", TESTS / "cli", TESTS / "mindspeed_rl" / "test_launcher.py")
# End-to-end files that run beside the e2e stream instead (one file at a time, on whichever worker
# is free, started first among the rest because each is long): the megatron engine's runs, the
# trace replay, the weight-delta and multi-turn runs, the windowed resume and the placement dry
# run. Which files are here keeps the e2e stream (one unit, which no other worker can share) the
# shorter of the two (runs/test_durations.json): then the worker that ends it takes what is left
# of the rest, and the two end together.
REST_PATHS = (
    TESTS / "mindspeed_rl" / "trainer" / "test_megatron_async_e2e.py",
    TESTS / "mindspeed_rl" / "trainer" / "test_async_delta_e2e.py",
    TESTS / "mindspeed_rl" / "trainer" / "test_multi_turn_faults_e2e.py",
    TESTS / "mindspeed_rl" / "trainer" / "test_multi_turn_eval_e2e.py",
    TESTS / "mindspeed_rl" / "trainer" / "test_window_resume_e2e.py",
    TESTS / "cli" / "test_replay_trace.py",
    TESTS / "cli" / "test_placement_dry_run.py",
)
INTEGRATION_MARK = "pytest.mark.integration"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stream-durations",
        metavar="PATH",
        default=None,
        help="write each test phase's duration, worker and stream, and the sums per stream and per "
        "worker, as JSON to PATH (tests/support/suite_durations.py; make test writes "
        "runs/test_durations.json)",
    )


class _StreamDurations:
    """Collects every phase report where reports arrive (the xdist controller, or the only process),
    and writes the summary at the end."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        from tests.support.suite_durations import PhaseTime

        self._config, self._path, self._record = config, path, PhaseTime
        self._phases: list[Any] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)  # xdist sets the reporting worker's controller
        worker = node.gateway.id if node is not None else "main"
        self._phases.append(
            self._record(nodeid=report.nodeid, when=report.when, seconds=report.duration, worker=worker)
        )

    def pytest_sessionfinish(self) -> None:
        import json

        from tests.support.suite_durations import summarize

        root = self._config.rootpath
        summary = summarize(self._phases, lambda nodeid: stream_of(root / nodeid.split("::", 1)[0]))
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._path.write_text(json.dumps(summary, indent=1) + "\n")


# This process's Ray temp root and the RAY_TMPDIR it replaced (restored at the end).
_RAY_ROOT = pytest.StashKey[tuple[str, "str | None"]]()


def pytest_configure(config: pytest.Config) -> None:
    """A Ray temp root of this pytest process's own (each xdist worker is one process).

    A CLI run joins the cluster named by the bootstrap file under ``$RAY_TMPDIR/ray`` (Ray's rule,
    followed by ``utils/ray_setup.py``): with a shared ``/tmp/ray`` it would join a test cluster
    another worker, or another checkout's tests, started on this host, and inherit that process's
    environment. Set before any test starts Ray, so every cluster, every CLI subprocess and every
    bootstrap file of this process lives under its own root. The path stays short: Ray's socket
    paths are limited to about 107 characters."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    root = tempfile.mkdtemp(prefix=f"rt-{worker}-", dir="/tmp" if os.path.isdir("/tmp") else None)
    config.stash[_RAY_ROOT] = (root, os.environ.get("RAY_TMPDIR"))
    os.environ["RAY_TMPDIR"] = root
    durations = config.getoption("stream_durations")
    if durations and not hasattr(config, "workerinput"):  # the controller (or the only process)
        config.pluginmanager.register(_StreamDurations(config, Path(durations)), "stream_durations")


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests.support import ray_cluster

    ray_cluster.stop()  # before its temp root goes
    root, before = config.stash.get(_RAY_ROOT, (None, None))
    if root is None:
        return
    if before is None:
        os.environ.pop("RAY_TMPDIR", None)
    else:
        os.environ["RAY_TMPDIR"] = before
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def policy_models(tmp_path_factory: pytest.TempPathFactory) -> PolicyModels:
    """The end-to-end runs' policy models, each distinct build made once (``tests/support/models.py``)."""
    from tests.support.models import PolicyModels

    return PolicyModels(tmp_path_factory.mktemp("policy_models"))


@functools.cache
def _marks_integration(path: Path) -> bool:
    try:
        return INTEGRATION_MARK in path.read_text()
    except OSError:  # not a file (a directory's nodeid): judged by its path alone
        return True


def _under(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == p or p in path.parents for p in roots)


def stream_of(path: Path) -> str:
    """``e2e`` for a test file under ``E2E_PATHS``, not in ``REST_PATHS``, that marks tests
    ``integration``; ``rest`` for any other."""
    return (
        "e2e"
        if _under(path, E2E_PATHS) and not _under(path, REST_PATHS) and _marks_integration(path)
        else "rest"
    )


def scope_of(file: str, rootpath: Path) -> str:
    """The scheduling unit of a test in ``file`` (its nodeid's path, relative to ``rootpath``): the
    whole e2e stream as one unit (its runs never overlap one another, and a session-scoped shared
    run is made once), any other test's file on its own."""
    return "e2e" if stream_of(rootpath / file) == "e2e" else file


def scope_rank(scope: str, rootpath: Path) -> int:
    """Which unit a free worker takes first: the e2e stream (the longest), then ``REST_PATHS``'
    long end-to-end files, then the rest in collection order (longest first keeps the tail short)."""
    if scope == "e2e":
        return 0
    return 1 if _under(rootpath / scope, REST_PATHS) else 2


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n 2 --dist loadscope`` (``make test``; the workers' Ray clusters are kept apart by
    ``pytest_configure``): the e2e stream is one unit, so it runs in order on one worker, and every
    other file is a unit of its own, so the rest of the suite runs beside it on the other worker and
    the first worker to run out of work takes what is left: the two end close together whichever
    stream is the longer, with no hand-kept balance. (xdist's own loadgroup cannot do this under
    pytest 9: it renames tests through ``Item._nodeid``, which pytest 9.2 no longer reads.) Any
    other --dist keeps xdist's scheduling."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class StreamScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid.split("::", 1)[0], root)

        def _assign_work_unit(self, node: Any) -> None:
            # xdist pops the queue's first unit; put the best-ranked there (stable within a rank).
            best = min(self.workqueue, key=lambda scope: scope_rank(scope, root))
            self.workqueue.move_to_end(best, last=False)
            super()._assign_work_unit(node)

    return StreamScheduling(config, log)
