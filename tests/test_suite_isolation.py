"""The suite's own set-up: each pytest process keeps its Ray clusters to itself (``conftest.py``)."""

from __future__ import annotations

import os
from pathlib import Path

from mindspeed_rl.utils import ray_setup


def test_a_cli_run_started_by_a_test_finds_only_this_processes_clusters() -> None:
    # The bootstrap file a CLI subprocess reads (it inherits os.environ) is under this process's
    # own root, never the host-wide /tmp/ray that another worker's or checkout's cluster writes.
    bootstrap = ray_setup.bootstrap_file(os.environ)
    root = Path(os.environ["RAY_TMPDIR"])
    assert bootstrap.parent == root / "ray"
    assert root != Path("/tmp") and root.name.startswith(
        f"rt-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-"
    )
    assert len(str(root)) < 40  # Ray's socket paths (about 107 characters) must still fit under it


def test_the_shared_test_cluster_is_joined_only_by_runs_that_ask_for_it() -> None:
    # tests/support/ray_cluster.py: the CLI runs that pass its environment join one cluster of this
    # process (RAY_ADDRESS, token mode); nothing announces it to the others, which start their own.
    from tests.support.ray_cluster import shared_cluster_env

    env = shared_cluster_env()
    assert ray_setup.find_cluster_address(env) == env["RAY_ADDRESS"] != ""  # it answers
    assert env["RAY_AUTH_MODE"] == "token"
    assert ray_setup.find_cluster_address({k: v for k, v in env.items() if k != "RAY_ADDRESS"}) is None
    assert not ray_setup.bootstrap_file(os.environ).exists()
