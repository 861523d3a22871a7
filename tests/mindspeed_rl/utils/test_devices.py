"""Device binding from Ray's assigned ids and the visible-devices variable."""

from __future__ import annotations

import pytest

from mindspeed_rl.utils import ray_setup
from mindspeed_rl.utils.devices import device_index, kind_of_backend


def test_index_is_the_position_among_visible_devices() -> None:
    assert device_index(["5"], ["5"]) == 0  # Ray narrowed the view to the actor's own device
    assert device_index(["6", "7"], ["6", "7"]) == 0  # a TP2 engine drives its first, workers the rest
    assert device_index(["3"], None) == 3  # every device visible: the physical id


def test_an_assigned_device_outside_the_visible_set_is_refused() -> None:
    with pytest.raises(ValueError, match="not among the visible devices"):
        device_index(["3"], ["0", "1"])
    with pytest.raises(ValueError, match="assigned no accelerator"):
        device_index([], ["0"])


def test_backends_name_their_device_kind() -> None:
    assert (kind_of_backend("nccl"), kind_of_backend("hccl"), kind_of_backend("gloo")) == ("GPU", "NPU", None)


def test_the_production_runtime_env_lets_ray_narrow_visible_devices() -> None:
    # With a NOSET flag Ray leaves every device visible, so an unbound rank lands on device 0.
    env = ray_setup.load_runtime_env(ray_setup.REPO_RUNTIME_ENV).get("env_vars", {})
    assert not [k for k in env if k.startswith("RAY_EXPERIMENTAL_NOSET_")]
