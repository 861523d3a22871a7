"""The vllm-ascend environment an RL engine needs (pure rules, and their wiring under a stand-in
NPU platform; no NPU here)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from mindspeed_rl.models.rollout.vllm_engine import (
    ASCEND_NZ_ENV,
    VLLMOptions,
    _prepare_process,
    ascend_rl_env,
)


@pytest.mark.parametrize("given", [None, "", "0"])
def test_nz_mode_is_off_unless_the_user_chose_otherwise(given: str | None) -> None:
    environ = {} if given is None else {ASCEND_NZ_ENV: given}
    assert ascend_rl_env(environ) == {ASCEND_NZ_ENV: "0"}


@pytest.mark.parametrize("given", ["1", "2"])
def test_an_nz_mode_that_breaks_weight_updates_is_refused_by_name(given: str) -> None:
    with pytest.raises(ValueError, match=f"{ASCEND_NZ_ENV}={given}.*unset it"):
        ascend_rl_env({ASCEND_NZ_ENV: given})


@pytest.mark.parametrize("device_type, expected", [("npu", "0"), ("cuda", None)])
def test_engine_setup_sets_the_nz_mode_on_npu_only(
    monkeypatch: pytest.MonkeyPatch, device_type: str, expected: str | None
) -> None:
    platforms = pytest.importorskip("vllm.platforms")
    monkeypatch.setattr(
        platforms, "current_platform", SimpleNamespace(device_type=device_type), raising=False
    )
    monkeypatch.delenv(ASCEND_NZ_ENV, raising=False)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    _prepare_process(VLLMOptions(), "unused", on_cpu=False)
    assert os.environ.get(ASCEND_NZ_ENV) == expected
