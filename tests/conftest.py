"""Fixtures every test package may use, and the suite's two streams under pytest-xdist."""

from __future__ import annotations

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
# other worker runs the rest of the suite alongside (``make test``: -n 2 --dist loadscope).
E2E_PATHS = (TESTS / "mindspeed_rl" / "trainer", TESTS / "cli", TESTS / "mindspeed_rl" / "test_launcher.py")
# The megatron engine's end-to-end runs, the trace replay, and the weight-delta and multi-turn
# fault runs go with the rest (beside megatron's own gloo tests), so that the two streams end close
# together: summed per stream from one two-stream run's durations, the e2e stream held about 15 %
# more than the rest before the last two (about 110 s together, measured alone) joined the rest.
REST_PATHS = (
    TESTS / "mindspeed_rl" / "trainer" / "test_megatron_async_e2e.py",
    TESTS / "mindspeed_rl" / "trainer" / "test_async_delta_e2e.py",
    TESTS / "mindspeed_rl" / "trainer" / "test_multi_turn_faults_e2e.py",
    TESTS / "cli" / "test_replay_trace.py",
)


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


def pytest_unconfigure(config: pytest.Config) -> None:
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


def stream_of(path: Path) -> str:
    """``e2e`` for a test under ``E2E_PATHS`` and not in ``REST_PATHS``, ``rest`` for any other."""
    under = lambda roots: any(path == p or p in path.parents for p in roots)  # noqa: E731
    return "e2e" if under(E2E_PATHS) and not under(REST_PATHS) else "rest"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n 2 --dist loadscope`` (``make test``; the workers' Ray clusters are kept apart by
    ``pytest_configure``): the scope of a test is its stream, so each stream
    runs in order on one worker: the end-to-end runs never overlap one another (nor is a session's
    shared run made twice), and the rest of the suite runs beside them. (xdist's own loadgroup
    cannot do this under pytest 9: it renames tests through ``Item._nodeid``, which pytest 9.2 no
    longer reads.) Any other --dist keeps xdist's scheduling."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class StreamScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return stream_of(config.rootpath / nodeid.split("::", 1)[0])

    return StreamScheduling(config, log)
