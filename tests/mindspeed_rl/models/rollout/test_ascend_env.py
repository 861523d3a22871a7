"""The vllm-ascend environment an RL engine needs (pure rules; no NPU here)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from mindspeed_rl.models.rollout.vllm_engine import ASCEND_NZ_ENV, ascend_rl_env


@pytest.mark.parametrize("given", [None, "", "0"])
def test_nz_mode_is_off_unless_the_user_chose_otherwise(given: str | None) -> None:
    environ = {} if given is None else {ASCEND_NZ_ENV: given}
    assert ascend_rl_env(environ) == {ASCEND_NZ_ENV: "0"}


@pytest.mark.parametrize("given", ["1", "2"])
def test_an_nz_mode_that_breaks_weight_updates_is_refused_by_name(given: str) -> None:
    with pytest.raises(ValueError, match=f"{ASCEND_NZ_ENV}={given}.*unset it"):
        ascend_rl_env({ASCEND_NZ_ENV: given})
