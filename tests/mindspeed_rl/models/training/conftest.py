from pathlib import Path

import pytest

from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY_TEST_ARCH, seed=0)
