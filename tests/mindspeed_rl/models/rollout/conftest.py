"""Shared fixtures: one tiny model per session, one torch thread."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    # The test machine's cores are shared: more than one OpenMP thread per process only spins.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY_TEST_ARCH, seed=0)
