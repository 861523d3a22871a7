"""Fixtures every test package may use."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.models import PolicyModels


@pytest.fixture(scope="session")
def policy_models(tmp_path_factory: pytest.TempPathFactory) -> PolicyModels:
    """The end-to-end runs' policy models, each distinct build made once (``tests/support/models.py``)."""
    from tests.support.models import PolicyModels

    return PolicyModels(tmp_path_factory.mktemp("policy_models"))
