"""Fixtures every test package may use, and the suite's two streams under pytest-xdist."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.support.models import PolicyModels

TESTS = Path(__file__).resolve().parent
# The end-to-end stream: CLI runs (Ray, engines, the launcher), one at a time. Measured on 2 cores,
# each keeps about 1.2 cores busy on average (start-up chains, hang timeouts, engine waits), so the
# other worker runs the rest of the suite alongside (``pytest -n 2 --dist loadscope``).
E2E_PATHS = (TESTS / "mindspeed_rl" / "trainer", TESTS / "cli", TESTS / "mindspeed_rl" / "test_launcher.py")
# The megatron engine's end-to-end runs go with the rest (beside megatron's own gloo tests): the
# two streams then take about as long as each other (measured: ~1000 s and ~800 s of one worker).
REST_PATHS = (TESTS / "mindspeed_rl" / "trainer" / "test_megatron_async_e2e.py",)


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
    """``-n 2 --dist loadscope`` (not ``make test``'s default yet: a CLI run joins any Ray cluster
    whose bootstrap file it finds on the node, including a test cluster the other stream started,
    so the streams are not yet isolated): the scope of a test is its stream, so each stream
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
