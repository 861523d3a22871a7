"""Fixtures every test package may use, and the suite's two streams under pytest-xdist."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.models import PolicyModels

TESTS = Path(__file__).resolve().parent
# The end-to-end stream: CLI runs (Ray, engines, the launcher), one at a time. Measured on 2 cores,
# each keeps about 1.2 cores busy on average (start-up chains, hang timeouts, engine waits), so the
# other core runs the rest of the suite alongside (``make test``: -n 2 --dist loadgroup).
E2E_PATHS = (TESTS / "mindspeed_rl" / "trainer", TESTS / "cli", TESTS / "mindspeed_rl" / "test_launcher.py")


@pytest.fixture(scope="session")
def policy_models(tmp_path_factory: pytest.TempPathFactory) -> PolicyModels:
    """The end-to-end runs' policy models, each distinct build made once (``tests/support/models.py``)."""
    from tests.support.models import PolicyModels

    return PolicyModels(tmp_path_factory.mktemp("policy_models"))


def stream_of(path: Path) -> str:
    """``e2e`` for a test under ``E2E_PATHS``, ``rest`` for any other."""
    return "e2e" if any(path == p or p in path.parents for p in E2E_PATHS) else "rest"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` every test joins one of two groups, each run in order on one
    worker: the end-to-end runs never overlap one another (nor do the session's shared runs get
    made twice), and the rest of the suite runs beside them. Without xdist: nothing changes."""
    if config.getoption("dist", default="no") != "loadgroup":
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(stream_of(Path(str(item.path)))))
