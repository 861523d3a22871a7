"""End-to-end runs shared by several test files of this folder (``tests/support/shared_runs.py``)."""

from __future__ import annotations

import pytest

from tests.support import shared_runs
from tests.support.cli_runs import CliRun, WatchedRun
from tests.support.models import PolicyModels


@pytest.fixture(scope="session")
def hybrid_run(
    tmp_path_factory: pytest.TempPathFactory, policy_models: PolicyModels
) -> shared_runs.HybridRun:
    return shared_runs.hybrid_run(tmp_path_factory.mktemp("hybrid"), policy_models)


@pytest.fixture(scope="session")
def tp2_tied_run(tmp_path_factory: pytest.TempPathFactory, policy_models: PolicyModels) -> WatchedRun:
    return shared_runs.tp2_tied_run(tmp_path_factory.mktemp("tp2_tied"), policy_models)


@pytest.fixture(scope="session")
def partial_qwen25_run(tmp_path_factory: pytest.TempPathFactory, policy_models: PolicyModels) -> CliRun:
    return shared_runs.partial_qwen25_run(tmp_path_factory.mktemp("partial_qwen25"), policy_models)
